// `multinorm sweep SWEEP.json`.
#include <CLI/CLI.hpp>

#include <cstdio>

#include "multinorm/cli.h"
#include "multinorm/json_file.h"
#include "multinorm/sweep.h"

namespace multinorm {

void add_sweep_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("sweep", "Run a grid or list of runs over a base config, with a summary");
  cmd->footer("Example: multinorm sweep configs/sweeps/paper_table1.json");
  static std::string path;
  static bool quiet = false;
  cmd->add_option("sweep", path, "sweep file (JSON)")->required();
  cmd->add_flag("--quiet", quiet, "no progress output");
  cmd->callback([] {
    const SweepPlan plan = load_sweep(path);
    const std::string summary = run_sweep(plan, quiet);
    std::printf("%s", read_text_file(summary).c_str());
    std::printf("summary: %s (and summary.csv, curves.png)\n", summary.c_str());
  });
}

}  // namespace multinorm
