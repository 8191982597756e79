// An update's device work as the trainer queues it (update_pipeline.h). Loss normalisation:
// micro_batch_mean (GaLore: every micro-batch's mean loss weighs the same, gradient scale
// 1 / (count x accum x ranks)) or token_mean (every counted target of the update weighs the same,
// scale 1 / total count).
#include "multinorm/update_pipeline.h"

#include <algorithm>
#include <chrono>

namespace multinorm {

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
double wall_clock() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }
}  // namespace

UpdatePipeline::UpdatePipeline(LlamaModel& model, Optimizer& optimizer, GradientSync& sync, Comm& comm, LossNormalization normalization,
                               int64_t accum)
    : model_(model), optimizer_(optimizer), sync_(sync), comm_(comm), normalization_(normalization), accum_(accum) {}

void UpdatePipeline::queue_micro_batches(const std::vector<MicroBatch>& batches, int64_t total_count, UpdateTimes* times) {
  model_.zero_grads();
  const auto t0 = Clock::now();
  std::vector<int64_t> counts;
  int64_t last_counted = -1;  // the last micro-batch with a counted target: its backward pass starts the reduction
  for (size_t a = 0; a < batches.size(); ++a) {
    counts.push_back(batches[a].count_targets());
    if (counts.back() > 0) last_counted = static_cast<int64_t>(a);
  }
  const int64_t world = comm_.size();
  for (size_t a = 0; a < batches.size(); ++a) {
    if (counts[a] == 0) continue;
    if (static_cast<int64_t>(a) == last_counted) sync_.arm();
    // The gradient summed over the ranks must be the global step's: token mean divides by every
    // rank's counted targets, micro-batch mean by every rank's micro-batches.
    const float scale = normalization_ == LossNormalization::TokenMean
                            ? 1.0f / static_cast<float>(total_count)
                            : 1.0f / (static_cast<float>(counts[a]) * static_cast<float>(accum_ * world));
    model_.queue_forward_backward(batches[a], scale);
  }
  times->forward_s = model_.last_forward_seconds(), times->backward_s = model_.last_backward_seconds();
  // When this rank's backward pass was queued (one clock for the ranks of a node, NTP's across
  // nodes): the latest over the ranks tells how much of this rank's communication wait was waiting
  // for a slower rank rather than for the collectives (metrics: comm_exposed_s).
  backward_end_ = wall_clock();
  times->compute_s = since(t0);
}

// The rest of the update's gradient reduction, waited for (with NCCL a host wait on its completion,
// with the collective timeout).
void UpdatePipeline::finish_reduction(UpdateTimes* times) {
  sync_.finish();
  double latest_backward_end = backward_end_;
  if (comm_.size() > 1) comm_.allreduce_max(&latest_backward_end, 1);
  times->comm_wait_s = sync_.last_wait_seconds();
  times->comm_exposed_s = std::max(0.0, times->comm_wait_s - (latest_backward_end - backward_end_));
}

void UpdatePipeline::queue_step(int64_t update, int64_t applied, const SpikeTest& spike, UpdateTimes* times) {
  finish_reduction(times);
  const auto t = Clock::now();
  optimizer_.queue_step(update, applied, spike);
  times->optimizer_s = since(t);
}

void UpdatePipeline::discard() {
  UpdateTimes ignored;
  finish_reduction(&ignored);
}

}  // namespace multinorm
