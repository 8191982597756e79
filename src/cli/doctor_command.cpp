// `multinorm doctor`: the CUDA backend checked on this machine's GPU against the CPU backend, with a
// timed step (include/multinorm/doctor.h).
#include <CLI/CLI.hpp>

#include "multinorm/cli.h"
#include "multinorm/doctor.h"

namespace multinorm {

void add_doctor_command(CLI::App& app) {
  static DoctorOptions o;
  auto* cmd = app.add_subcommand("doctor",
                                 "Check the CUDA backend on this machine's GPU: environment, every op and optimizer against the CPU "
                                 "backend, a training update, a checkpoint round trip, NCCL, a timed step");
  cmd->add_option("--model,-m", o.models, "model configs by name or path, repeatable; 'largest': the largest that fits the GPU")
      ->capture_default_str();
  cmd->add_option("--batch", o.batch, "micro-batch (sequences) of the op shapes and the timed step")->capture_default_str();
  cmd->add_option("--step-batch", o.step_batch, "the timed step's micro-batch instead (0: --batch), e.g. 32 for llama_1b's 32 x 256 update")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--seq", o.seq, "sequence length")->capture_default_str();
  cmd->add_option("--steps", o.steps, "timed steps")->capture_default_str();
  cmd->add_option("--warmup", o.warmup, "untimed steps first")->capture_default_str();
  cmd->add_flag("!--no-bench", o.bench, "skip the timed step");
  cmd->add_option("--only", o.only, "run only these sections (op, optimizer, update, checkpoint), repeatable")
      ->check(CLI::IsMember({"op", "optimizer", "update", "checkpoint"}));
  cmd->add_option("--report", o.report, "the JSON report")->capture_default_str();
  cmd->add_option("--threads", o.threads, "CPU backend threads (0: all cores)");
  cmd->footer("Example: multinorm doctor --model llama_60m --model llama_1b --model largest");
  cmd->callback([] {
    const int rc = run_doctor(o);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace multinorm
