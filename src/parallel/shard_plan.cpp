#include "multinorm/shard_plan.h"

#include <algorithm>
#include <numeric>

namespace multinorm {

namespace {
constexpr double kFlopsPerByte = 20.0;
}

double update_cost(const ParamAssignment& a, const RunConfig& run) {
  const TensorSpec& t = *a.tensor;
  const double n = static_cast<double>(t.numel());
  const double wb = dtype_bytes(run.precision.params), gb = dtype_bytes(run.precision.grads),
               sb = dtype_bytes(run.precision.optimizer_states);
  const int slots = optimizer_state_slots(a.optimizer, run.optimizer.momentum);
  if (a.optimizer == OptimizerKind::SinkGD) {
    const double L = static_cast<double>(run.optimizer.sinkgd.iterations);
    return n * ((2 * L + 2) * gb + 2 * wb) + 6 * L * n / kFlopsPerByte;
  }
  if (a.optimizer == OptimizerKind::Swan && t.shape.size() == 2) {
    const double m = static_cast<double>(t.shape[0]), c = static_cast<double>(t.shape[1]);
    const double k = std::min(m, c), big = std::max(m, c);
    const double flops = 4 * k * k * big + 6 * static_cast<double>(run.optimizer.swan.ns_steps) * k * k * k;
    return n * (2 * gb + 2 * wb + 8) + flops / kFlopsPerByte;
  }
  return n * (2 * wb + gb + 2 * sb * slots);  // Adam, AdamW, SGD: one pass
}

ShardPlan plan_shards(const std::vector<ParamAssignment>& assign, const RunConfig& run, int world, int rank, bool shard) {
  ShardPlan p;
  p.world = world;
  p.rank = rank;
  for (const auto& a : assign) p.cost.push_back(update_cost(a, run));
  if (!shard || world <= 1) return p;
  std::vector<size_t> order(assign.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return p.cost[x] > p.cost[y]; });
  std::vector<double> load(static_cast<size_t>(world), 0.0);
  p.owner.assign(assign.size(), 0);
  for (size_t i : order) {
    const int r = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    p.owner[i] = r;
    load[static_cast<size_t>(r)] += p.cost[i];
  }
  return p;
}

std::vector<OwnerRun> owner_runs(const ShardPlan& plan, const std::vector<TensorSpec>& specs, int64_t begin, int64_t end) {
  std::vector<OwnerRun> runs;
  for (size_t i = 0; i < specs.size(); ++i) {
    const int64_t at = specs[i].arena_offset, n = specs[i].arena_numel();
    if (at < begin || at >= end) continue;
    const int owner = plan.owner_of(i);
    if (!runs.empty() && runs.back().owner == owner && runs.back().end == at) runs.back().end += n;
    else runs.push_back({owner, at, at + n});
  }
  return runs;
}

std::vector<int64_t> state_bytes_per_rank(const ShardPlan& plan, const std::vector<ParamAssignment>& assign,
                                          const RunConfig& run) {
  std::vector<int64_t> bytes(static_cast<size_t>(plan.world), 0);
  for (size_t i = 0; i < assign.size(); ++i) {
    const int64_t b = assign[i].tensor->numel() * optimizer_state_slots(assign[i].optimizer, run.optimizer.momentum) *
                      dtype_bytes(run.precision.optimizer_states);
    if (plan.sharded()) bytes[static_cast<size_t>(plan.owner[i])] += b;
    else
      for (auto& x : bytes) x += b;
  }
  return bytes;
}

}  // namespace multinorm
