// Sharded optimizer work (ZeRO-1 for per-tensor optimizers): whole tensors are assigned to ranks,
// balanced by the estimated cost of their update, so each rank updates (and keeps the optimizer
// state of) its own tensors only. Whole tensors, never slices: SinkGD's column norms and SWAN's
// whitening need the whole matrix, and the rules stay the single-process kernels unchanged.
#pragma once
#include <cstdint>
#include <vector>

#include "multinorm/param_groups.h"
#include "multinorm/run_config.h"

namespace multinorm {

struct ShardPlan {
  int world = 1, rank = 0;
  std::vector<int> owner;     // per tensor, in model order; empty: not sharded (every rank updates all)
  std::vector<double> cost;   // per tensor: the estimated cost of its update (byte-equivalents)
  bool sharded() const { return !owner.empty(); }
  bool mine(size_t tensor) const { return owner.empty() || owner[tensor] == rank; }
  int owner_of(size_t tensor) const { return owner.empty() ? rank : owner[tensor]; }
};

// The cost model, in byte-equivalents (bytes moved + FLOPs / 20; 20 FLOP per byte lies between a
// CPU's machine balance and an A100's, and keeps SWAN's O(k^2 max(m,n)) Newton-Schulz dominant on
// both): Adam/AdamW and SGD by the bytes of their one pass, SinkGD by its 2L+2 passes over G and
// the read and write of W, SWAN by its Gram products and Newton-Schulz GEMMs.
double update_cost(const ParamAssignment& a, const RunConfig& run);

// Longest-processing-time assignment: tensors by decreasing cost (ties: model order), each to the
// least loaded rank so far (ties: the lowest rank). Deterministic, so every rank computes the same
// plan. With shard = false or one rank, the plan is not sharded.
ShardPlan plan_shards(const std::vector<ParamAssignment>& assign, const RunConfig& run, int world, int rank, bool shard);

// The tensors of `specs` (model order, as the plan) starting in the arena range [begin, end), as
// runs of consecutive tensors with one owner: one collective per run (a reduce of gradients to
// their owner, a broadcast of the owner's new weights).
struct OwnerRun {
  int owner;
  int64_t begin, end;  // arena elements
};
std::vector<OwnerRun> owner_runs(const ShardPlan& plan, const std::vector<TensorSpec>& specs, int64_t begin, int64_t end);

// Bytes of optimizer state each rank holds under `plan` (the unsharded figure on every rank when
// the plan is not sharded).
std::vector<int64_t> state_bytes_per_rank(const ShardPlan& plan, const std::vector<ParamAssignment>& assign,
                                          const RunConfig& run);

}  // namespace multinorm
