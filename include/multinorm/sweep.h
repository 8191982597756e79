// `multinorm sweep SWEEP.json`: a base run config and a grid (cartesian product) and/or a list of
// overrides. Each run gets its own directory under the sweep's output_dir and runs as a child
// `multinorm train` process (N at a time); finished runs are skipped and interrupted ones resumed,
// so re-running a sweep continues it. Writes summary.csv, summary.md and curves.png, and the
// optimizer comparison of `multinorm compare` (comparison.{md,csv,json,png}) of its finished runs.
//
//   {"base": "../quickstart.json", "output_dir": "runs/sweep", "parallel": 1,
//    "set": {"schedule.total_steps": 100},
//    "grid": {"optimizer.name": ["sinkgd", "adam"], "optimizer.lr": [0.02, 0.001]},
//    "runs": [{"name": "swan", "set": {"optimizer.name": "swan"}},
//             {"name": "adam_1b", "config": "../c4/llama_1b_adam.json"}]}
// Paths (base, a run's config, a model.config value) are relative to the sweep file; "base" may be
// left out when every run names its config.
#pragma once
#include <string>
#include <vector>

namespace multinorm {

struct SweepRun {
  std::string name;
  std::vector<std::string> overrides;  // key=value
  std::string config;                  // the run config it changes: its own "config", else the sweep's base
};

struct SweepPlan {
  std::string base_config, output_dir;  // base_config: "" when every run names its own
  int parallel = 1;
  std::vector<SweepRun> runs;
};

// Where the runs go on a GPU node (`sweep --gpus 0-7 --gpus-per-run N`): the GPUs are split into
// slots of N, one run per slot at a time; each child sees only its slot (CUDA_VISIBLE_DEVICES), and a
// run of N > 1 GPUs is launched as `mpirun -np N` (one rank per GPU, data parallel).
struct SweepPlacement {
  std::vector<int> gpus;  // empty: none (plan.parallel runs at a time, each choosing as `train` does)
  int gpus_per_run = 1;
  std::string mpirun = "mpirun";  // the launcher of multi-GPU runs (searched in PATH)
};
// "0-7", "0,1,4-5": GPU ids, each once, in order.
std::vector<int> parse_gpu_list(const std::string& text);

SweepPlan load_sweep(const std::string& path);
// Runs (or resumes) every run, then writes the summary; returns the summary's path.
std::string run_sweep(const SweepPlan& plan, const SweepPlacement& where, bool quiet);

}  // namespace multinorm
