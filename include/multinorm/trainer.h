// The trainer: `multinorm train` and `multinorm eval`. Ties the model, the optimizer and the data:
// gradient accumulation into a global batch, evaluation, metrics, checkpoints (atomic, bit-exact
// resume), divergence and skipped updates (divergence.h). The loop and its parts: src/train/.
#pragma once
#include <cstdint>
#include <string>

#include "multinorm/comm.h"
#include "multinorm/llama_model.h"
#include "multinorm/loader.h"
#include "multinorm/run_config.h"

namespace multinorm {

struct TrainOptions {
  bool resume = false;
  std::string resume_from;  // a checkpoint directory to resume from instead of the latest (implies resume)
  bool allow_config_change = false;  // with resume: accept a changed schedule, optimizer, ... (printed)
  int64_t max_updates = -1;  // stop (with a checkpoint) after this update, schedule unchanged; -1: total_steps
  bool quiet = false;
};

struct EvalResult {
  double loss = 0;         // unbiased: mean of per-batch mean losses
  double galore_loss = 0;  // GaLore's figure: sum of batch means / (batches + 1)
  int64_t batches = 0, tokens = 0;
  double perplexity() const;
  double galore_perplexity() const;
};

struct TrainResult {
  int64_t updates = 0, skipped = 0;
  double last_loss = 0;
  EvalResult eval;
  // seconds: the whole run (set-up, evaluation, checkpoints); update_seconds: its updates alone (the
  // sum of their step_s), which tokens_per_s is over.
  double seconds = 0, update_seconds = 0, tokens_per_s = 0;
  std::string run_dir, last_checkpoint;
  int stopped_by = 0;  // the signal that stopped the run after its last update (stop_signals.h); 0: none
};

TrainResult train(const RunConfig& run, const TrainOptions& opt);

// `multinorm train` stopped by a signal after an update, its checkpoint written: every rank exits
// with kStoppedBySignalStatus (75), which a job script requeues on (docs/training-on-c4.md).
class StoppedBySignal : public Error {
 public:
  explicit StoppedBySignal(const std::string& message) : Error(message) {}
};

// Evaluates `model` on `data` over `token_budget` counted targets (the same code the trainer uses).
// With several ranks, each evaluates its slice of every step and the sums are taken over the ranks.
EvalResult evaluate(LlamaModel& model, std::shared_ptr<const ShardSet> data, int64_t micro_batch, int64_t token_budget,
                    Comm& comm = Comm::world());

// The newest complete checkpoint directory of a run ("" when none).
std::string latest_checkpoint(const std::string& run_dir);
// The checkpoint a command reads from `path`: a run directory's newest, or `path` itself when it holds
// a model. A path that does not exist, a run directory with no checkpoint yet, or a directory that is
// neither, is an Error that says which (`what`: the option that named it, e.g. "--checkpoint").
std::string checkpoint_to_read(const std::string& path, const std::string& what);

}  // namespace multinorm
