// `multinorm compare RUN_DIR...`: the paper's optimizer comparison from any set of run directories.
//
// For every run: its final loss; the updates, tokens and training seconds it needed to reach the
// reference run's final loss (first crossing, linear interpolation between two evaluations); the
// speed-ups against the reference; raw tokens/s and effective tokens/s (raw x token efficiency, the
// paper's Figure 1c); optimizer-state and peak resident memory. Everything is read from what a run
// directory already holds: config.json (the resolved config), metrics.jsonl, result.json.
//
// Time is training time: the sum of the updates' step_s (evaluation and checkpoints excluded), so a
// run resumed three times is timed like one that ran through.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace multinorm {

// One run's history on the compared metric.
struct RunCurve {
  std::string dir, name, optimizer;
  std::vector<int64_t> steps;  // update at which each point was measured (ascending)
  std::vector<double> tokens;  // tokens seen by then
  std::vector<double> seconds; // training seconds by then
  std::vector<double> loss;    // the metric (validation loss, or the trailing mean of training loss)
  int64_t updates = 0;         // last update recorded
  double total_tokens = 0, total_seconds = 0;
  int64_t state_bytes = -1;    // optimizer state (result.json or the latest checkpoint); -1 unknown
  int64_t peak_rss_bytes = 0;  // largest rss_bytes recorded
  int64_t missing_updates = 0; // updates with no metrics record (their time is not counted)
  std::string comparability;   // model, data, batch and evaluation settings, as one JSON text
  double paper_ppl = 0;        // the paper's perplexity for this run's recipe (paper_figures.h); 0: none
  std::string paper_row;       // "Table 1, SinkGD"
};

// Where a curve first reaches `target` (loss <= target).
struct Crossing {
  bool reached = false;
  bool at_first_point = false;  // already below at the first evaluation: the figures are upper bounds
  double steps = 0, tokens = 0, seconds = 0;
};
Crossing first_crossing(const RunCurve& curve, double target);

enum class CompareMetric { ValLoss, TrainLoss };

// Reads a run directory. TrainLoss uses the trailing mean over `window` updates at every update.
RunCurve load_run_curve(const std::string& dir, CompareMetric metric, int window = 20);

struct CompareRow {
  size_t run = 0;  // index into Comparison::runs
  double final_loss = 0;
  Crossing crossing;
  double speedup_steps = 0, speedup_tokens = 0, speedup_time = 0;  // 0 when not reached
  double raw_tokens_per_s = 0, effective_tokens_per_s = 0;           // effective 0 when not reached
  std::string flags;  // how the run differs from the reference in model/data/batch, or why a figure is a bound
};

struct Comparison {
  std::vector<RunCurve> runs;
  size_t reference = 0;
  std::string reference_reason;  // "given", "best Adam run", ...
  CompareMetric metric = CompareMetric::ValLoss;
  double target = 0;             // the reference's final loss
  std::vector<CompareRow> rows;  // in the order of `runs`
};

// Builds the comparison. `reference` is a run directory or "" (the Adam run with the lowest final
// loss; with no Adam run, the run with the lowest final loss). Runs whose model, data, global batch,
// seq_len or evaluation budget differ from the reference's are refused (ConfigError naming the
// difference) unless `allow_mismatch`, which keeps them with the difference in their flags.
Comparison compare_runs(std::vector<RunCurve> runs, const std::string& reference, CompareMetric metric,
                        bool allow_mismatch);

std::string comparison_markdown(const Comparison& c);
std::string comparison_csv(const Comparison& c);
std::string comparison_text(const Comparison& c);  // the table for a terminal
// Writes STEM.md, STEM.csv, STEM.json (curves, for the plot) and STEM.png (loss against tokens and
// against training time; skipped with a warning when matplotlib is missing) under out_dir.
// Returns the PNG's path, or "" when it was not drawn.
std::string write_comparison(const Comparison& c, const std::string& out_dir, const std::string& stem, bool quiet);

// Runs grouped by comparability (model, data, batch, evaluation), in first-seen order: a sweep over
// several models gets one comparison per model.
std::vector<std::vector<RunCurve>> group_comparable(std::vector<RunCurve> runs);

}  // namespace multinorm
