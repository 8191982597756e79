// The optimizer layer. A TensorRule is one algorithm (SinkGD, SWAN, Adam, AdamW, SGD) applied to
// one tensor through the backend's fused kernel; rules are built by name from the registry
// (src/optim/registry.cpp). An Optimizer assigns a rule to every parameter (param_groups.h), owns
// the state arena, and runs one update: learning-rate schedule, optional global-norm clipping,
// every tensor's rule. An update's scalars (learning rates, Adam's bias corrections, the norm, the
// clip factor, the skip flag) live in the backend's memory (update_scalars.h), where its kernels
// read them: the host need not wait for the norm before queuing the update (queue_step), and on
// CUDA the update's launches are captured once as a graph and replayed.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "multinorm/backend.h"
#include "multinorm/comm.h"
#include "multinorm/communicator.h"
#include "multinorm/llama_model.h"
#include "multinorm/param_groups.h"
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
  // Whether its ops run without host waits (so they can be queued ahead and captured in a graph):
  // SWAN reads its Newton-Schulz residual on the host and falls back to the host's exact path.
  virtual bool host_free() const { return true; }
  virtual bool matrices_only() const { return false; }
  virtual void update(Backend& be, const TensorSpec& t, Buf w, Buf g, Buf* states, const UpdateContext& ctx) const = 0;
  // Several tensors whose contexts differ only in the tensor id (a multi-tensor launch where the
  // rule has one); the default updates them one by one.
  virtual void update_many(Backend& be, const std::vector<RuleItem>& items) const {
    for (const RuleItem& it : items) update(be, *it.tensor, it.w, it.g, it.states, it.ctx);
  }
  // Whether the optimizer passes this rule's large tensors to update_many too (small ones always go):
  // for a rule whose backend op gains from seeing every tensor at once.
  virtual bool updates_large_tensors_together() const { return false; }
};

using RuleFactory = std::function<std::unique_ptr<TensorRule>(const OptimizerConfig&)>;

// Builds the rule registered under `name`; ConfigError naming the choices for an unknown name.
std::unique_ptr<TensorRule> make_rule(const std::string& name, const OptimizerConfig& config);
std::vector<std::string> registered_rules();

struct StepStats {
  double lr_multiplier = 0, lr_matrix = 0, lr_fallback = 0;
  double grad_norm = 0;  // before clipping
  bool clipped = false;
  bool skipped = false;  // the norm was not finite: nothing was applied
  SwanStats swan;        // Newton-Schulz convergence of this update's SWAN tensors
};

// Data parallelism's part of the optimizer: which rank updates which tensor, the communicator that
// broadcasts the owners' new weights (over the backend's memory) and the host communicator for the
// gradient norm's partial sums and the checkpoint gather. Default: one process, everything local.
struct OptimizerSharding {
  ShardPlan plan;
  Communicator* weights = nullptr;
  Comm* host = nullptr;
};

class Optimizer {
 public:
  Optimizer(LlamaModel& model, const RunConfig& run, const OptimizerSharding& sharding = {});
  ~Optimizer();

  // Applies update number `update` (from 1) with the model's accumulated gradients; `applied` counts
  // the updates applied so far including this one (update minus skipped ones). Nothing is applied,
  // and no state advances, when the gradient norm is not finite.
  StepStats step(int64_t update, int64_t applied);
  // The gradient norm step(update, ...) will use, measured now: the statistics computed where the
  // gradients are (Backend::update_statistics) and read in one crossing (with sharding, the
  // per-tensor sums are read and summed over the ranks: every rank calls it). The trainer calls it
  // before step so that this read, the update's one host wait, also delivers the micro-batches'
  // queued losses, which it checks before anything is applied. step() measures itself when this was
  // not called for the same update.
  double measure_gradient_norm(int64_t update);
  // step() without any host wait: the update's scalars, its statistics on the device, clipping and
  // every rule are queued; the kernels read the clip factor and the skip flag where they run, so a
  // non-finite norm applies nothing, as in step(). The statistics are queued for the host
  // (to_host_queued): queued_step_stats() has them once a wait after this call delivered them (a
  // fence). Needs can_queue_steps().
  void queue_step(int64_t update, int64_t applied);
  StepStats queued_step_stats() const;
  // Empty when queue_step() is possible; otherwise why not (SWAN's host reads; a sharded optimizer,
  // whose norm is summed over the ranks on the host).
  std::string why_steps_cannot_be_queued() const;
  // With graphs on and a backend that has them, the update's clipping and rules are captured at the
  // second update and replayed after (one launch); the statistics and the scalars' upload stay out.
  void set_graphs(bool on) { graphs_ = on; }
  int64_t graph_captures() const { return graph_captures_; }
  int64_t graph_replays() const { return graph_replays_; }
  // Why the optimizer stopped capturing its update (empty while it captures or never tried).
  std::string graph_capture_error() const { return failed_captures_ >= 2 ? capture_error_ : ""; }
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
  void write_scalars(const StepStats& lr, int64_t update, int64_t applied);
  // Clipping and every rule (replayed from the graph when there is one); then SWAN's statistics and
  // the owners' broadcast.
  void apply(StepStats& st);
  void apply_ops();
  bool rules_host_free() const;
  LlamaModel& model_;
  RunConfig run_;
  std::vector<ParamAssignment> assign_;
  std::vector<std::unique_ptr<TensorRule>> rules_;  // one per tensor (shared configs are cheap)
  std::vector<std::vector<Buf>> states_;            // per tensor (empty for another rank's tensor)
  std::vector<int64_t> file_offset_;                // per tensor: its states' byte offset in the file layout
  OptimizerSharding sharding_;
  void* arena_ = nullptr;
  int64_t state_bytes_ = 0, matrix_state_bytes_ = 0, local_state_bytes_ = 0;
  DType state_dtype_;
  double lr_scale_ = 1.0;
  int64_t measured_update_ = -1;   // the update measure_gradient_norm() last measured
  int64_t measured_version_ = -1;  // and the model's gradient_version() then
  UpdateScalars* scalars_ = nullptr;  // backend memory: what the update's ops read
  UpdateScalars host_scalars_;        // the host part's next contents
  std::vector<int> slot_;             // per tensor: its (rule, learning-rate group) slot
  std::vector<size_t> slot_first_;    // per slot: its first tensor (whose rule forms the slot's scalars)
  std::vector<size_t> mine_;          // the tensors this rank updates, their gradients and sizes
  std::vector<Buf> mine_grads_;
  std::vector<int64_t> mine_sizes_;
  UpdateStatistics measured_;         // the statistics measure_gradient_norm() read
  UpdateStatistics queued_;           // queue_step()'s, delivered by a later wait
  StepStats queued_lr_;               // the learning rates of the update queue_step() queued
  bool graphs_ = false;
  bool settled_ = false;  // the last eager update moved no buffer: the next one can be captured
  int64_t graph_ = -1, graph_captures_ = 0, graph_replays_ = 0, failed_captures_ = 0;
  std::string capture_error_;
};

}  // namespace multinorm
