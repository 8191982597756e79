// The optimizer layer. A TensorRule is one algorithm (SinkGD, SWAN, Adam, AdamW, SGD) applied to
// one tensor through the backend's fused kernel; rules are built by name from the registry
// (src/optim/registry.cpp). An Optimizer assigns a rule to every parameter (param_groups.h), owns
// the state arena, and runs one update: learning-rate schedule, optional global-norm clipping,
// every tensor's rule. An update is queued with no host wait (queue_step): its scalars (learning
// rates, Adam's bias corrections) and its statistics (the norm, the clip factor, the loss, the skip
// flag) live in the backend's memory (update_scalars.h), where its kernels read them, and the host
// reads the statistics later (wait_for_step). On CUDA the update's launches are one graph.
#pragma once
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "multinorm/backend.h"
#include "multinorm/comm.h"
#include "multinorm/communicator.h"
#include "multinorm/graph_cache.h"
#include "multinorm/param_groups.h"
#include "multinorm/param_store.h"
#include "multinorm/run_config.h"
#include "multinorm/shard_plan.h"

namespace multinorm {

struct UpdateContext {
  float lr = 0;           // this tensor's learning rate for this update
  int64_t update = 1;     // optimizer update number, from 1 (schedule, stochastic-rounding counter)
  int64_t applied = 1;    // updates applied so far, this one included (Adam's bias correction):
                          // differs from `update` once non-finite updates were skipped
  uint64_t seed = 0;      // run seed (stochastic rounding)
  uint64_t tensor = 0;    // tensor index (stochastic rounding)
  bool stochastic = false;
  ScalarsRef scalars;     // the update's scalars in backend memory (the ops read lr, steps, skip there)
  SwanStats* swan_stats = nullptr;  // where SWAN's ops add their statistics (backend memory)
};

// One tensor's update, for rules that update several tensors in one backend call.
struct RuleItem {
  const TensorSpec* tensor;
  Buf w, g;
  Buf* states;
  UpdateContext ctx;
};

class TensorRule {
 public:
  virtual ~TensorRule() = default;
  virtual std::string name() const = 0;
  virtual int state_slots() const = 0;      // per-element state tensors (Adam: m, v)
  // This rule's scalars for an update (UpdateScalars::rule), from ctx's lr and applied count.
  virtual RuleScalars scalars(const UpdateContext& ctx) const = 0;
  // Whether the matrices' learning rate is lr x optimizer.alpha (the paper's SinkGD and SWAN).
  virtual bool scales_lr_by_alpha() const { return false; }
  virtual bool matrices_only() const { return false; }
  virtual void update(OptimizerKernels& kernels, const TensorSpec& t, Buf w, Buf g, Buf* states, const UpdateContext& ctx) const = 0;
  // Several tensors whose contexts differ only in the tensor id (a multi-tensor launch where the
  // rule has one); the default updates them one by one.
  virtual void update_many(OptimizerKernels& kernels, const std::vector<RuleItem>& items) const {
    for (const RuleItem& it : items) update(kernels, *it.tensor, it.w, it.g, it.states, it.ctx);
  }
  // Whether the optimizer passes this rule's large tensors to update_many too (small ones always go):
  // for a rule whose backend op gains from seeing every tensor at once.
  virtual bool updates_large_tensors_together() const { return false; }
};

using RuleFactory = std::function<std::unique_ptr<TensorRule>(const OptimizerConfig&)>;

// Builds the rule of an optimizer (src/optim/registry.cpp).
std::unique_ptr<TensorRule> make_rule(OptimizerKind kind, const OptimizerConfig& config);

// What the device tests an update's loss against (the divergence monitor's, divergence.h): a loss
// above `threshold` is a spike; with `skip`, the device skips the update when it spikes.
struct SpikeTest {
  double threshold = std::numeric_limits<double>::infinity();
  bool skip = false;
};

// One update as the host learns it (wait_for_step): learning rates, and the statistics the device
// computed (update_scalars.h).
struct StepStats {
  int64_t update = 0;
  double lr_multiplier = 0, lr_matrix = 0, lr_fallback = 0;
  double grad_norm = 0;  // before clipping
  double loss = 0;       // over every rank (the loss normalisation's)
  int64_t tokens = 0;    // counted positions, over every rank
  bool clipped = false;
  bool skipped = false;  // nothing was applied (skip_reason says why)
  SkipReason skip_reason = kNotSkipped;
  bool spike = false;    // the loss exceeded the spike test's threshold
  SwanStats swan;        // Newton-Schulz convergence of this update's SWAN tensors
};

// Data parallelism's part of the optimizer: which rank updates which tensor; the communicator over
// the backend's memory that sums the update's statistics over the ranks (the loss totals; with a
// sharded optimizer the per-tensor sums of squares) and broadcasts the owners' new weights; the host
// communicator for the checkpoint gather and SWAN's counts. Default: one process, everything local.
struct OptimizerSharding {
  ShardPlan plan;
  Communicator* collectives = nullptr;
  Comm* host = nullptr;
};

// What the optimizer reads of a run's config, kept by value.
struct OptimizerSettings {
  OptimizerConfig optimizer;
  ScheduleConfig schedule;
  LossNormalization loss_normalization = LossNormalization::MicroBatchMean;
  uint64_t seed = 0;  // stochastic rounding
  DType state_dtype = DType::BF16;
  static OptimizerSettings of(const RunConfig& run);
};

class Optimizer {
 public:
  // Updates the parameters of `params` with their accumulated gradients and loss totals.
  Optimizer(ParamStore& params, const OptimizerSettings& settings, const OptimizerSharding& sharding = {});
  Optimizer(ParamStore& params, const RunConfig& run, const OptimizerSharding& sharding = {})
      : Optimizer(params, OptimizerSettings::of(run), sharding) {}
  ~Optimizer();

  // Queues update number `update` (from 1) with the store's accumulated gradients and loss totals,
  // with no host wait: its scalars, its statistics on the device (with several ranks, the loss
  // totals, and the per-tensor sums of squares of a sharded optimizer, summed over the ranks there),
  // clipping, and every rule, whose kernels read the clip factor and the skip flag where they run: a
  // skipped update (a non-finite loss or norm, or a spike `spike` says to skip) changes nothing. The
  // statistics are copied to the host behind it, and a fence recorded. `applied` counts the updates
  // applied so far including this one (update minus skipped ones: Adam's bias correction). The
  // previous update must have been waited for.
  void queue_step(int64_t update, int64_t applied, const SpikeTest& spike = {});
  // The queued update's statistics: waits for its fence (free when a wait since has passed it).
  StepStats wait_for_step();
  // queue_step, then wait_for_step: one update, synchronously (tests, benchmarks, the doctor).
  StepStats step(int64_t update, int64_t applied, const SpikeTest& spike = {});
  // With graphs on and a backend that has them, the update's clipping and rules are one graph
  // (GraphCache); the scalars' upload, the statistics and the collectives stay outside.
  void set_graphs(bool on) { graphs_.set_enabled(on); }
  const GraphCache& graphs() const { return graphs_; }
  // Every later update's learning rate times `scale` (the divergence monitor's rollback lowers it).
  void set_lr_scale(double scale) { lr_scale_ = scale; }

  // The optimizer state of the whole model (every rank's share), and of the matrices alone.
  int64_t state_bytes() const { return state_bytes_; }
  int64_t matrix_state_bytes() const { return matrix_state_bytes_; }
  // The state this rank keeps (state_bytes() unless sharded).
  int64_t local_state_bytes() const { return local_state_bytes_; }
  const std::vector<ParamAssignment>& assignments() const { return assign_; }
  const ShardPlan& shard_plan() const { return sharding_.plan; }
  // The whole state as raw bytes in the single-process layout (tensor order): checkpoints are the
  // same files whatever the world size and sharding. Sharded, every rank must call it (the owners
  // send their tensors' states to rank 0) and only rank 0 gets the bytes (the others get none).
  std::vector<uint8_t> states_to_host() const;
  // From the single-process layout; each rank keeps its own tensors' states.
  void states_from_host(const std::vector<uint8_t>& bytes);

 private:
  void broadcast_weights();
  // lr_multiplier, lr_matrix and lr_fallback of update `update`.
  StepStats learning_rates(int64_t update) const;
  // The host part of the update's scalars, to the backend's memory.
  void write_scalars(const StepStats& lr, int64_t update, int64_t applied, const SpikeTest& spike);
  // The statistics on the device: sums of squares, the sums over the ranks, the finish.
  void queue_statistics();
  // Clipping and every rule (GraphCache).
  void apply_ops();
  SwanStats swan_stats_over_ranks(SwanStats mine);
  ParamStore& params_;
  OptimizerSettings settings_;
  std::vector<ParamAssignment> assign_;
  std::vector<std::unique_ptr<TensorRule>> rules_;  // one per tensor (shared configs are cheap)
  std::vector<std::vector<Buf>> states_;            // per tensor (empty for another rank's tensor)
  std::vector<int64_t> file_offset_;                // per tensor: its states' byte offset in the file layout
  OptimizerSharding sharding_;
  void* arena_ = nullptr;
  int64_t state_bytes_ = 0, matrix_state_bytes_ = 0, local_state_bytes_ = 0;
  DType state_dtype_;
  double lr_scale_ = 1.0;
  UpdateScalars* scalars_ = nullptr;  // backend memory: what the update's ops read
  double* squares_ = nullptr;         // backend memory: per tensor, its gradient's sum of squares
  UpdateScalars host_scalars_;        // the host part's next contents
  std::vector<int> slot_;             // per tensor: its (rule, learning-rate group) slot
  std::vector<size_t> slot_first_;    // per slot: its first tensor (whose rule forms the slot's scalars)
  std::vector<Buf> grads_;            // per tensor: its gradient
  std::vector<int64_t> measured_;     // per tensor: its length on this rank (0: another rank's, which adds it)
  bool has_swan_ = false, alpha_scaled_ = false;
  GraphCache graphs_;
  StepStats pending_;                 // the queued update: its learning rates; its statistics once delivered
  UpdateStatistics delivered_;        // the queued update's statistics, copied here by the wait
  int64_t fence_ = 0;
  bool waited_ = true;
};

}  // namespace multinorm
