// One optimizer update over every parameter: schedule, optional clipping, each tensor's rule.
#include "multinorm/optimizer.h"

#include <cmath>
#include <cstddef>
#include <map>

#include "../../kernels/common/optim_math.h"
#include "multinorm/cuda_scratch.h"
#include "multinorm/communicator.h"
#include "multinorm/error.h"
#include "multinorm/schedule.h"

namespace multinorm {

namespace {
// Tensors up to this many elements go into multi-tensor updates (every norm weight of the paper's
// models: at most 8192 elements; the matrices and embeddings are far larger).
constexpr int64_t kMultiTensorElements = cuda_scratch::kMultiTensorElements;
// The host-written part of UpdateScalars: everything before the statistics.
constexpr int64_t kHostScalarBytes = offsetof(UpdateScalars, stats);
}  // namespace

OptimizerSettings OptimizerSettings::of(const RunConfig& run) {
  return {run.optimizer, run.schedule, run.batch.loss_normalization, static_cast<uint64_t>(run.seed), run.precision.optimizer_states};
}

Optimizer::Optimizer(ParamStore& params, const OptimizerSettings& settings, const OptimizerSharding& sharding)
    : params_(params), settings_(settings), sharding_(sharding), state_dtype_(settings.state_dtype), graphs_(params.backend().queue()) {
  const OptimizerConfig& config = settings_.optimizer;
  assign_ = assign_optimizers(params_.tensors(), config);
  if (sharding_.plan.sharded() && sharding_.plan.owner.size() != assign_.size())
    throw Error("optimizer: the shard plan covers " + std::to_string(sharding_.plan.owner.size()) + " tensors, the model has " +
                std::to_string(assign_.size()));
  int64_t elements = 0, local = 0;
  for (size_t i = 0; i < assign_.size(); ++i) {
    const auto& a = assign_[i];
    rules_.push_back(make_rule(a.optimizer, config));
    const int64_t n = a.tensor->numel() * rules_.back()->state_slots();
    file_offset_.push_back(elements * dtype_bytes(state_dtype_));
    elements += n;
    if (sharding_.plan.mine(i)) local += n;
    if (a.matrix) matrix_state_bytes_ += n * dtype_bytes(state_dtype_);
  }
  state_bytes_ = elements * dtype_bytes(state_dtype_);
  local_state_bytes_ = local * dtype_bytes(state_dtype_);
  // One slot of scalars per (rule, learning-rate group): the groups the update's multi-tensor calls use.
  std::map<std::pair<std::string, bool>, int> slots;
  for (size_t i = 0; i < assign_.size(); ++i) {
    const auto key = std::make_pair(rules_[i]->name(), assign_[i].matrix);
    if (!slots.count(key)) {
      if (static_cast<int>(slots.size()) == kUpdateRuleSlots)
        throw Error("optimizer: more than " + std::to_string(kUpdateRuleSlots) + " (rule, learning-rate group) pairs");
      const int next = static_cast<int>(slots.size());
      slots[key] = next;
    }
    slot_.push_back(slots[key]);
    if (static_cast<size_t>(slots[key]) == slot_first_.size()) slot_first_.push_back(i);
  }
  // Every tensor's gradient is measured, each by the rank that updates it (the others measure 0
  // elements of it: a zero, added over the ranks): listed once, every update passes the same list.
  for (size_t i = 0; i < assign_.size(); ++i) {
    grads_.push_back(params_.grad(*assign_[i].tensor));
    measured_.push_back(sharding_.plan.mine(i) ? assign_[i].tensor->arena_numel() : 0);  // (its padding: zeros)
    has_swan_ = has_swan_ || assign_[i].optimizer == OptimizerKind::Swan;
  }
  alpha_scaled_ = make_rule(config.name, config)->scales_lr_by_alpha();
  Backend& be = params_.backend();
  scalars_ = static_cast<UpdateScalars*>(be.allocate(sizeof(UpdateScalars)));
  squares_ = static_cast<double*>(be.allocate(static_cast<int64_t>(assign_.size() * sizeof(double))));
  arena_ = be.allocate(std::max<int64_t>(local_state_bytes_, 1));
  Buf cursor{arena_, state_dtype_};
  for (size_t i = 0; i < assign_.size(); ++i) {
    std::vector<Buf> s;
    if (sharding_.plan.mine(i))
      for (int k = 0; k < rules_[i]->state_slots(); ++k) {
        s.push_back(cursor);
        cursor = cursor.at(assign_[i].tensor->numel());
      }
    states_.push_back(std::move(s));
  }
}

Optimizer::~Optimizer() {
  Backend& be = params_.backend();
  be.release(arena_);
  be.release(squares_);
  be.release(scalars_);
}

StepStats Optimizer::learning_rates(int64_t update) const {
  StepStats st;
  st.update = update;
  st.lr_multiplier = schedule_multiplier(settings_.schedule, update);
  const double lr_t = settings_.optimizer.lr * lr_scale_ * st.lr_multiplier;
  st.lr_matrix = lr_t * (alpha_scaled_ ? settings_.optimizer.alpha : 1.0);
  st.lr_fallback = lr_t;
  return st;
}

void Optimizer::write_scalars(const StepStats& lr, int64_t update, int64_t applied, const SpikeTest& spike) {
  host_scalars_.update = static_cast<uint64_t>(update);
  host_scalars_.spike_threshold = spike.threshold;
  host_scalars_.skip_spikes = spike.skip;
  host_scalars_.token_mean = settings_.loss_normalization == LossNormalization::TokenMean;
  for (const size_t i : slot_first_) {
    UpdateContext ctx;
    ctx.lr = static_cast<float>(assign_[i].matrix ? lr.lr_matrix : lr.lr_fallback);
    ctx.update = update;
    ctx.applied = applied;
    host_scalars_.rule[slot_[i]] = rules_[i]->scalars(ctx);
  }
  params_.backend().to_device(scalars_, &host_scalars_, kHostScalarBytes);
}

// The global norm from per-tensor sums of squares added in tensor order: the same FP64 number
// whether one rank holds every reduced gradient or each owner its own (the others add zeros). With
// several ranks the loss totals (and, sharded, the sums of squares) are summed over them on the
// device (MPI on the CPU backend's memory, NCCL on a GPU's), the compute ordered after the sum.
void Optimizer::queue_statistics() {
  Backend& be = params_.backend();
  const int64_t count = static_cast<int64_t>(assign_.size());
  LossTotals* loss = params_.update_loss_totals();
  be.optimizer_kernels().sum_squares_many(grads_.data(), measured_.data(), count, squares_);
  Communicator* c = sharding_.collectives;
  if (c && c->size() > 1) {
    c->all_reduce_sum(loss, kLossTotalsDoubles, DType::F64, "the sum of the update's losses over the ranks");
    if (sharding_.plan.sharded()) c->all_reduce_sum(squares_, count, DType::F64, "the gradient norm's sums of squares over the ranks");
    c->after_mark(c->mark());
  }
  be.optimizer_kernels().update_statistics(scalars_, loss, squares_, count, settings_.optimizer.grad_clip);
}

void Optimizer::queue_step(int64_t update, int64_t applied, const SpikeTest& spike) {
  if (!waited_) throw Error("optimizer: update " + std::to_string(update) + " queued before update " + std::to_string(pending_.update) + " was waited for");
  Backend& be = params_.backend();
  pending_ = learning_rates(update);
  write_scalars(pending_, update, applied, spike);
  queue_statistics();
  graphs_.run("update", [&] { apply_ops(); });  // a skipped update's kernels return at once
  if (sharding_.plan.sharded()) broadcast_weights();
  be.queue().copy_to_host_later(&delivered_, &scalars_->stats, sizeof(UpdateStatistics));
  fence_ = be.queue().fence();
  waited_ = false;
}

StepStats Optimizer::wait_for_step() {
  if (!waited_) {
    params_.backend().queue().wait(fence_);
    waited_ = true;
    pending_.grad_norm = delivered_.grad_norm;
    pending_.loss = delivered_.loss;
    pending_.tokens = static_cast<int64_t>(delivered_.tokens);
    pending_.clipped = delivered_.clipped;
    pending_.skipped = delivered_.skip;
    pending_.skip_reason = static_cast<SkipReason>(delivered_.skip_reason);
    pending_.spike = delivered_.spike;
    pending_.swan = swan_stats_over_ranks(delivered_.swan);  // a skipped update's SWAN ops counted nothing
    if (pending_.swan.exact_failures > 0)  // the device ran on; on the CPU the op threw at once
      throw Error("swan: the exact whitening (LAPACK dsyevd) failed on " + std::to_string(pending_.swan.exact_failures) +
                  " tensors of update " + std::to_string(pending_.update) + "; they were not updated");
  }
  return pending_;
}

StepStats Optimizer::step(int64_t update, int64_t applied, const SpikeTest& spike) {
  queue_step(update, applied, spike);
  return wait_for_step();
}

// SWAN's Newton-Schulz statistics of the update (this rank's, from the device), over the ranks when
// sharded: host collectives, every rank reading its statistics at the same update.
SwanStats Optimizer::swan_stats_over_ranks(SwanStats st) {
  if (!has_swan_ || !sharding_.plan.sharded()) return st;
  double counts[4] = {double(st.tensors), double(st.unconverged), double(st.fallbacks), double(st.exact_failures)};
  double most[2] = {st.worst_residual, double(st.steps)};
  sharding_.host->allreduce_sum(counts, 4);
  sharding_.host->allreduce_max(most, 2);
  st.tensors = static_cast<uint32_t>(counts[0]);
  st.unconverged = static_cast<uint32_t>(counts[1]);
  st.fallbacks = static_cast<uint32_t>(counts[2]);
  st.exact_failures = static_cast<uint32_t>(counts[3]);
  st.worst_residual = most[0];
  st.steps = static_cast<uint32_t>(most[1]);
  return st;
}

void Optimizer::apply_ops() {
  OptimizerKernels& kernels = params_.backend().optimizer_kernels();
  const ShardPlan& plan = sharding_.plan;
  // Clipping: the gradients this rank updates times the clip factor, read on the device (a launch
  // over each run of them; nothing happens when the factor is 1).
  if (settings_.optimizer.grad_clip > 0) {
    if (!plan.sharded()) kernels.clip_gradients(params_.grads(), params_.arena_elements(), scalars_);
    else
      for (const OwnerRun& r : owner_runs(plan, params_.tensors(), 0, params_.arena_elements()))
        if (r.owner == plan.rank) kernels.clip_gradients(params_.grads().at(r.begin), r.end - r.begin, scalars_);
  }
  // Small tensors (the norm weights) of one rule and learning rate are updated together: one
  // backend call, one launch on a device; so are all the tensors of a rule that asks for it (SinkGD:
  // the CPU overlaps one tensor's memory traffic with another's passes). Tensors are independent,
  // so the order does not matter.
  std::map<std::pair<std::string, bool>, std::pair<const TensorRule*, std::vector<RuleItem>>> together;
  for (size_t i = 0; i < assign_.size(); ++i) {
    if (!plan.mine(i)) continue;
    const TensorSpec& t = *assign_[i].tensor;
    UpdateContext ctx;
    ctx.lr = host_scalars_.rule[slot_[i]].lr;
    ctx.update = static_cast<int64_t>(host_scalars_.update);
    ctx.seed = settings_.seed;
    ctx.tensor = i;
    ctx.stochastic = settings_.optimizer.rounding == Rounding::Stochastic;
    ctx.scalars = {scalars_, slot_[i]};
    ctx.swan_stats = &scalars_->stats.swan;
    if (t.numel() <= kMultiTensorElements || rules_[i]->updates_large_tensors_together()) {
      auto& group = together[{rules_[i]->name(), assign_[i].matrix}];
      group.first = rules_[i].get();
      group.second.push_back({&t, params_.param(t), params_.grad(t), states_[i].data(), ctx});
      continue;
    }
    rules_[i]->update(kernels, t, params_.param(t), params_.grad(t), states_[i].data(), ctx);
  }
  for (const auto& [key, group] : together) group.first->update_many(kernels, group.second);
}

// Every owner broadcasts its tensors' new weights; consecutive tensors of one owner go as one
// broadcast. The compute after it waits for them on the device (MPI: the host completes them).
void Optimizer::broadcast_weights() {
  Communicator& c = *sharding_.collectives;
  for (const OwnerRun& r : owner_runs(sharding_.plan, params_.tensors(), 0, params_.arena_elements()))
    c.broadcast(params_.params().at(r.begin).ptr, r.end - r.begin, params_.dtype(), r.owner, "broadcast of updated weights from their owner");
  c.after_mark(c.mark());
}

std::vector<uint8_t> Optimizer::states_to_host() const {
  const ShardPlan& plan = sharding_.plan;
  const bool root = !plan.sharded() || plan.rank == 0;
  std::vector<uint8_t> out(root ? static_cast<size_t>(state_bytes_) : 0);
  for (size_t i = 0; i < assign_.size(); ++i) {
    const int64_t bytes = assign_[i].tensor->numel() * rules_[i]->state_slots() * dtype_bytes(state_dtype_);
    if (bytes == 0) continue;
    const int owner = plan.owner_of(i);
    if (owner == plan.rank) {  // a tensor's slots are adjacent in the arena, as in the file
      std::vector<uint8_t> mine(static_cast<size_t>(bytes));
      params_.backend().to_host(mine.data(), states_[i][0].ptr, bytes);
      if (root) std::copy(mine.begin(), mine.end(), out.begin() + file_offset_[i]);
      else sharding_.host->send(mine.data(), bytes, 0);
    } else if (root) {
      sharding_.host->recv(out.data() + file_offset_[i], bytes, owner);
    }
  }
  return out;
}

void Optimizer::states_from_host(const std::vector<uint8_t>& bytes) {
  if (static_cast<int64_t>(bytes.size()) != state_bytes_)
    throw Error("optimizer state: expected " + std::to_string(state_bytes_) + " bytes, got " + std::to_string(bytes.size()));
  for (size_t i = 0; i < assign_.size(); ++i) {
    if (states_[i].empty()) continue;
    const int64_t n = assign_[i].tensor->numel() * rules_[i]->state_slots() * dtype_bytes(state_dtype_);
    params_.backend().to_device(states_[i][0].ptr, bytes.data() + file_offset_[i], n);
  }
}

}  // namespace multinorm
