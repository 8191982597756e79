// `multinorm train` and `multinorm eval`.
#include <CLI/CLI.hpp>

#include <cstdio>

#include "multinorm/device.h"
#include "multinorm/c4_reader.h"
#include "multinorm/checkpoint.h"
#include "multinorm/cli.h"
#include "multinorm/comm.h"
#include "multinorm/error.h"
#include "multinorm/json_file.h"
#include "multinorm/llama_model.h"
#include "multinorm/stop_signals.h"
#include "multinorm/trainer.h"

namespace multinorm {

void add_train_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("train", "Pretrain a LLaMA from a run config");
  cmd->footer("Example: bash scripts/mpirun_graceful.sh -np 8 multinorm train --config configs/c4/llama_1b_sinkgd.json --resume");
  static std::string path;
  static std::vector<std::string> overrides;
  static TrainOptions o;
  cmd->add_option("--config,-c", path, "run config (JSON)")->required();
  cmd->add_option("--set", overrides, "override a key, e.g. --set optimizer.lr=0.01 (repeatable)");
  cmd->add_flag("--resume", o.resume, "continue from the run directory's latest checkpoint (bit-exact)");
  cmd->add_option("--resume-from", o.resume_from,
                  "continue from this checkpoint directory instead (an earlier one, when the latest is damaged)");
  cmd->add_flag("--allow-config-change", o.allow_config_change,
                "with --resume: accept a config that differs from the checkpoint's (schedule length, lr, ...), "
                "printing the differences");
  // Aliases of config keys (one skip mechanism: divergence.action skip), kept for older scripts.
  static bool skip_nonfinite = false;
  static int64_t max_skips = -1;  // -1: the config's (hidden from --help, as every such sentinel)
  cmd->add_flag("--skip-nonfinite", skip_nonfinite, "an alias of --set divergence.action=skip (skip and count non-finite or spiking updates)");
  cmd->add_option("--max-consecutive-skips", max_skips, "an alias of --set divergence.max_consecutive_skips=N")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  cmd->add_option("--max-updates", o.max_updates, "stop after this update (with a checkpoint); the schedule is unchanged");
  cmd->add_flag("--quiet", o.quiet, "no progress output");
  cmd->callback([] {
    if (skip_nonfinite) overrides.push_back("divergence.action=skip");
    if (max_skips >= 1) overrides.push_back("divergence.max_consecutive_skips=" + std::to_string(max_skips));
    if ((skip_nonfinite || max_skips > 0) && Comm::world().root())
      std::fprintf(stderr, "note: --skip-nonfinite and --max-consecutive-skips are aliases of divergence.action=skip and "
                           "divergence.max_consecutive_skips (docs/training.md)\n");
    const RunConfig run = load_run_config(path, overrides);
    const TrainResult r = train(run, o);
    if (r.stopped_by)
      throw StoppedBySignal("stopped by " + std::string(StopSignals::name(r.stopped_by)) + " after " + std::to_string(r.updates) +
                            " update(s) of this run; checkpoint " + r.last_checkpoint + "; go on with --resume");
    if (!Comm::world().root()) return;  // rank 0 reports for the run
    if (r.updates == 0 && r.skipped == 0)
      std::printf("nothing to train: %s is already at its last update (schedule.total_steps or --max-updates)\n",
                  r.run_dir.c_str());
    else
      std::printf("trained %lld updates in %.1f s of updates (%.0f tokens/s), %.1f s in all with set-up, evaluation and "
                  "checkpoints; last loss %.4f%s\n",
                  (long long)r.updates, r.update_seconds, r.tokens_per_s, r.seconds, r.last_loss,
                  r.skipped ? (" (" + std::to_string(r.skipped) + " skipped)").c_str() : "");
    if (r.eval.batches)
      std::printf("validation: loss %.4f, perplexity %.2f (%lld tokens)\n", r.eval.loss, r.eval.perplexity(),
                  (long long)r.eval.tokens);
    std::printf("run directory: %s (metrics.jsonl%s, checkpoints/)\n", r.run_dir.c_str(),
                run.log_tensorboard ? ", TensorBoard event files" : "");
  });

  auto* ev = app.add_subcommand("eval", "Validation loss and perplexity of a checkpoint");
  ev->footer("Example: multinorm eval --checkpoint runs/c4_llama_60m_sinkgd");
  static std::string checkpoint, data;
  static int64_t tokens = -1;
  static bool as_json = false;
  ev->add_option("--checkpoint", checkpoint, "checkpoint directory (runs/NAME/checkpoints/step_N) or a run directory")->required();
  ev->add_option("--data", data, "validation shards (default: the run's data.validation)");
  ev->add_option("--tokens", tokens, "counted target tokens to evaluate (default: the run's eval.tokens)");
  ev->add_flag("--json", as_json, "machine-readable output");
  ev->callback([] {
    const std::string dir = checkpoint_to_read(checkpoint, "--checkpoint");  // a run directory: its newest
    const auto verify = verify_reads_of(dir);  // every file of the checkpoint checked as it is read
    const std::string config = checkpoint_run_config_path(dir);  // the checkpoint's own, self-sufficient
    const RunConfig run = run_config_from_json(read_json_file(config), config);
    auto be = make_backend(choose_backend(run.backend), static_cast<int>(run.threads));
    LlamaModel model(*be, run.model, run.precision.params, run.eval.micro_batch, run.batch.seq_len);
    const TrainerState st = read_checkpoint(dir, model.store(), nullptr, run);
    const std::string globs = data.empty() ? run.data.validation : data;
    if (globs.empty()) throw ConfigError("eval: no validation data (--data, or data.validation in the run config)");
    auto val = std::make_shared<const ShardSet>(expand_globs(globs), run.batch.seq_len, run.model.vocab_size);
    const uint64_t h = check_data_identity(*val, "", run.data.layout, run.model.vocab_size);  // layout, vocabulary, one tokenizer
    if (h != 0 && st.tokenizer_hash != 0 && h != st.tokenizer_hash)
      throw Error(globs + ": tokenized with another tokenizer than the one " + dir + " was trained with");
    const EvalResult r = evaluate(model, val, run.eval.micro_batch, tokens > 0 ? tokens : run.eval.tokens);
    if (!Comm::world().root()) return;  // under mpirun the ranks split the batches; rank 0 reports
    if (as_json) {
      std::printf("%s\n", json{{"checkpoint", dir}, {"step", st.step}, {"loss", r.loss}, {"perplexity", r.perplexity()},
                               {"galore_loss", r.galore_loss}, {"galore_perplexity", r.galore_perplexity()},
                               {"batches", r.batches}, {"tokens", r.tokens}}.dump(2).c_str());
    } else {
      std::printf("%s (update %lld): validation loss %.4f, perplexity %.3f over %lld tokens in %lld batches\n",
                  dir.c_str(), (long long)st.step, r.loss, r.perplexity(), (long long)r.tokens, (long long)r.batches);
      std::printf("  GaLore's figure (sum of batch means / (batches + 1)): loss %.4f, perplexity %.3f\n", r.galore_loss,
                  r.galore_perplexity());
    }
  });
}

}  // namespace multinorm
