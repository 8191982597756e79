// `multinorm sweep SWEEP.json`: a base run config and a grid (cartesian product) and/or a list of
// overrides. Each run gets its own directory under the sweep's output_dir and runs as a child
// `multinorm train` process (N at a time); finished runs are skipped and interrupted ones resumed,
// so re-running a sweep continues it. Writes summary.csv, summary.md and curves.png, and the
// optimizer comparison of `multinorm compare` (comparison.{md,csv,json,png}) of its finished runs.
//
//   {"base": "../quickstart.json", "output_dir": "runs/sweep", "parallel": 1,
//    "set": {"schedule.total_steps": 100},
//    "grid": {"optimizer.name": ["sinkgd", "adam"], "optimizer.lr": [0.02, 0.001]},
//    "runs": [{"name": "swan", "set": {"optimizer.name": "swan"}}]}
#pragma once
#include <string>
#include <vector>

namespace multinorm {

struct SweepRun {
  std::string name;
  std::vector<std::string> overrides;  // key=value
};

struct SweepPlan {
  std::string base_config, output_dir;
  int parallel = 1;
  std::vector<SweepRun> runs;
};

SweepPlan load_sweep(const std::string& path);
// Runs (or resumes) every run, then writes the summary; returns the summary's path.
std::string run_sweep(const SweepPlan& plan, bool quiet);

}  // namespace multinorm
