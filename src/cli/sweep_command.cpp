// `multinorm sweep SWEEP.json`.
#include <CLI/CLI.hpp>

#include <cstdio>

#include "multinorm/cli.h"
#include "multinorm/error.h"
#include "multinorm/json_file.h"
#include "multinorm/sweep.h"

namespace multinorm {

void add_sweep_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("sweep", "Run a grid or list of runs over a base config, with a summary");
  cmd->footer("Example: multinorm sweep configs/sweeps/paper_table1.json --gpus 0-7");
  static std::string path;
  static bool quiet = false;
  cmd->add_option("sweep", path, "sweep file (JSON)")->required();
  cmd->add_flag("--quiet", quiet, "no progress output");
  static std::string gpus;
  static SweepPlacement where;
  cmd->add_option("--gpus", gpus, "GPUs to spread the runs over (0-7, 0,1,4-5): one run per --gpus-per-run of them at a time, "
                                  "each seeing only its own (CUDA_VISIBLE_DEVICES); default: the sweep file's parallel, no placement");
  cmd->add_option("--gpus-per-run", where.gpus_per_run, "GPUs of each run: more than 1 launches it as `mpirun -np N` (data parallel)")
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--mpirun", where.mpirun, "the MPI launcher of multi-GPU runs (the one multinorm was built with)");
  cmd->callback([] {
    const SweepPlan plan = load_sweep(path);
    if (!gpus.empty()) where.gpus = parse_gpu_list(gpus);
    else if (where.gpus_per_run > 1) throw ConfigError("--gpus-per-run needs --gpus (the GPUs to spread the runs over)");
    const std::string summary = run_sweep(plan, where, quiet);
    std::printf("%s", read_text_file(summary).c_str());
    std::printf("summary: %s (and summary.csv, curves.png)\n", summary.c_str());
  });
}

}  // namespace multinorm
