// The training loop. One update = `accum` micro-batches (global_batch / (micro_batch x ranks)),
// gradients accumulated in the model's gradient arena, then one optimizer step. The loop queues
// update k and settles update k - 1: k's micro-batches are queued (no host wait), then k - 1's
// statistics are read (its step finished while k's micro-batches run), judged, logged, evaluated and
// checkpointed, then k's step is queued. A device is never idle between updates; on the CPU, whose
// ops are done when they return, the same code finds everything settled. Everything decided about
// k - 1 (a trip, a skip's count, a checkpoint) comes before k's step is queued: k's micro-batches read
// the weights and write only gradients, which a rollback drops. A stop signal (stop_signals.h) ends
// the loop at an update's boundary, the update in flight settled. The parts: training_run.h.
#include "multinorm/trainer.h"

#include <unistd.h>

#include <cmath>
#include <optional>

#include "multinorm/checkpoint.h"
#include "training_run.h"

namespace multinorm {

TrainResult train(const RunConfig& run, const TrainOptions& opt) {
  TrainingRun r(run, opt);
  std::optional<QueuedUpdate> settling;  // queued, its statistics not read yet
  for (int64_t k = r.next_update();;) {
    std::optional<QueuedUpdate> next;
    if (k <= r.last_update()) next = r.queue_micro_batches(k);
    if (settling) {
      const bool rolled_back = r.settle(*settling);
      settling.reset();
      if (rolled_back) {
        if (next) r.discard(*next);
        k = r.next_update();
        continue;
      }
    }
    if (!next) break;
    r.queue_step(*next);
    settling = std::move(next);
    ++k;
  }
  return r.finish();
}

double EvalResult::perplexity() const { return std::exp(loss); }
double EvalResult::galore_perplexity() const { return std::exp(galore_loss); }

EvalResult evaluate(LlamaModel& model, std::shared_ptr<const ShardSet> data, int64_t micro_batch, int64_t token_budget, Comm& comm) {
  EvalLoader loader(std::move(data), micro_batch, token_budget, comm.rank(), comm.size());
  double sums[3] = {0, 0, 0};  // sum of micro-batch means, micro-batches, counted tokens: over all ranks
  Batch b;
  while (loader.next(b)) {
    if (b.count == 0) continue;
    const LossSum l = model.forward(b.view());
    sums[0] += l.mean();
    sums[1] += 1;
    sums[2] += static_cast<double>(l.count);
  }
  comm.allreduce_sum(sums, 3);
  EvalResult r;
  r.batches = static_cast<int64_t>(sums[1]);
  r.tokens = static_cast<int64_t>(sums[2]);
  if (r.batches == 0) throw Error("eval: the validation data holds no counted target");
  r.loss = sums[0] / r.batches;
  r.galore_loss = sums[0] / (r.batches + 1);
  return r;
}

std::string latest_checkpoint(const std::string& run_dir) {
  const auto all = checkpoint_dirs(run_dir + "/checkpoints");
  return all.empty() ? "" : run_dir + "/checkpoints/" + all.back();
}

std::string checkpoint_to_read(const std::string& path, const std::string& what) {
  auto exists = [&](const std::string& name) { return ::access((path + name).c_str(), F_OK) == 0; };
  if (!exists("")) throw Error(what + " " + path + ": no such file or directory");
  const std::string newest = latest_checkpoint(path);
  if (!newest.empty()) return newest;
  if (exists("/model.safetensors") || exists("/manifest.json") || exists("/trainer_state.json")) return path;
  if (exists("/checkpoints") || exists("/metrics.jsonl") || exists("/config.json"))
    throw Error(what + " " + path + ": a run directory with no checkpoint yet (" + path +
                "/checkpoints holds none: the run stopped before its first, checkpoint.every)");
  throw Error(what + " " + path + ": neither a checkpoint (no model.safetensors) nor a run directory (no checkpoints/)");
}

}  // namespace multinorm
