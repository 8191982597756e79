// One optimizer update over every parameter: schedule, optional clipping, each tensor's rule.
#include "multinorm/optimizer.h"

#include <cmath>
#include <cstddef>
#include <map>

#include "../../kernels/common/optim_math.h"
#include "../../kernels/cuda/scratch_sizes.h"
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

Optimizer::Optimizer(LlamaModel& model, const RunConfig& run, const OptimizerSharding& sharding)
    : model_(model), run_(run), sharding_(sharding), state_dtype_(run.precision.optimizer_states) {
  assign_ = assign_optimizers(model.tensors(), run.optimizer);
  if (sharding_.plan.sharded() && sharding_.plan.owner.size() != assign_.size())
    throw Error("optimizer: the shard plan covers " + std::to_string(sharding_.plan.owner.size()) + " tensors, the model has " +
                std::to_string(assign_.size()));
  int64_t elements = 0, local = 0;
  for (size_t i = 0; i < assign_.size(); ++i) {
    const auto& a = assign_[i];
    rules_.push_back(make_rule(a.optimizer, run.optimizer));
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
  // The gradients this rank measures, listed once (every update passes the same list).
  for (size_t i = 0; i < assign_.size(); ++i)
    if (sharding_.plan.mine(i))
      mine_.push_back(i), mine_grads_.push_back(model_.grad(*assign_[i].tensor)), mine_sizes_.push_back(assign_[i].tensor->numel());
  Backend& be = model_.backend();
  scalars_ = static_cast<UpdateScalars*>(be.allocate(sizeof(UpdateScalars)));
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
  Backend& be = model_.backend();
  if (graph_ >= 0) be.release_graph(graph_);
  be.release(arena_);
  be.release(scalars_);
}

double Optimizer::measure_gradient_norm(int64_t update) {
  Backend& be = model_.backend();
  const ShardPlan& plan = sharding_.plan;
  const int64_t count = static_cast<int64_t>(mine_.size());
  const double clip = run_.optimizer.grad_clip;
  if (plan.sharded()) {
    // The global norm from per-tensor sums of squares added in tensor order: the same FP64 number
    // whether one rank holds every reduced gradient or each owner its own (the others add zeros).
    // The rank's sums come back in one crossing, are summed over the ranks, and the statistics go
    // to the backend's memory for the update's kernels.
    std::vector<double> squares(assign_.size(), 0.0), mine_squares(mine_.size());
    be.sum_squares_many(mine_grads_.data(), mine_sizes_.data(), count, mine_squares.data());
    for (size_t k = 0; k < mine_.size(); ++k) squares[mine_[k]] = mine_squares[k];
    sharding_.host->allreduce_sum(squares.data(), static_cast<int64_t>(squares.size()));
    measured_ = optim_math::finish_statistics(squares.data(), static_cast<int64_t>(squares.size()), clip);
    be.to_device(&scalars_->stats, &measured_, sizeof(UpdateStatistics));
  } else {
    // Computed where the gradients are, then read: the update's one crossing.
    be.update_statistics(scalars_, mine_grads_.data(), mine_sizes_.data(), count, clip);
    be.to_host(&measured_, &scalars_->stats, sizeof(UpdateStatistics));
  }
  measured_update_ = update;
  measured_version_ = model_.gradient_version();
  return measured_.grad_norm;
}

StepStats Optimizer::learning_rates(int64_t update) const {
  StepStats st;
  st.lr_multiplier = schedule_multiplier(run_.schedule, update);
  const double lr_t = run_.optimizer.lr * lr_scale_ * st.lr_multiplier;
  const bool scaled = run_.optimizer.name == "sinkgd" || run_.optimizer.name == "swan";
  st.lr_matrix = lr_t * (scaled ? run_.optimizer.alpha : 1.0);
  st.lr_fallback = lr_t;
  return st;
}

void Optimizer::write_scalars(const StepStats& lr, int64_t update, int64_t applied) {
  host_scalars_.update = static_cast<uint64_t>(update);
  for (const size_t i : slot_first_) {
    UpdateContext ctx;
    ctx.lr = static_cast<float>(assign_[i].matrix ? lr.lr_matrix : lr.lr_fallback);
    ctx.update = update;
    ctx.applied = applied;
    host_scalars_.rule[slot_[i]] = rules_[i]->scalars(ctx);
  }
  model_.backend().to_device(scalars_, &host_scalars_, kHostScalarBytes);
}

bool Optimizer::rules_host_free() const {
  for (const auto& r : rules_)
    if (!r->host_free()) return false;
  return true;
}

std::string Optimizer::why_steps_cannot_be_queued() const {
  if (sharding_.plan.sharded()) return "the optimizer is sharded (its gradient norm is summed over the ranks on the host)";
  for (const auto& r : rules_)
    if (!r->host_free()) return r->name() + " reads its Newton-Schulz residual on the host";
  return "";
}

StepStats Optimizer::step(int64_t update, int64_t applied) {
  StepStats st = learning_rates(update);
  if (measured_update_ != update || measured_version_ != model_.gradient_version()) measure_gradient_norm(update);
  measured_update_ = -1;  // an update's gradients are measured for one step
  st.grad_norm = measured_.grad_norm;
  st.skipped = measured_.skip;
  if (st.skipped) return st;  // the trainer decides (stop or skip); nothing is applied
  st.clipped = measured_.clipped;
  write_scalars(st, update, applied);
  apply(st);
  return st;
}

void Optimizer::queue_step(int64_t update, int64_t applied) {
  const std::string why = why_steps_cannot_be_queued();
  if (!why.empty()) throw Error("optimizer: update " + std::to_string(update) + " cannot be queued: " + why);
  Backend& be = model_.backend();
  queued_lr_ = learning_rates(update);
  write_scalars(queued_lr_, update, applied);
  be.update_statistics(scalars_, mine_grads_.data(), mine_sizes_.data(), static_cast<int64_t>(mine_.size()), run_.optimizer.grad_clip);
  apply(queued_lr_);  // a skipped update's kernels return at once
  be.to_host_queued(&queued_, &scalars_->stats, sizeof(UpdateStatistics));
}

StepStats Optimizer::queued_step_stats() const {
  StepStats st = queued_lr_;
  st.grad_norm = queued_.grad_norm;
  st.skipped = queued_.skip;
  st.clipped = queued_.clipped;
  return st;
}

// The update's ops as a graph where the backend has graphs: run eagerly until one eager run moved no
// buffer (scratch grown, descriptor tables uploaded: the next run finds everything where it is),
// captured the next time, replayed after; a graph whose buffers moved is dropped and the cycle
// starts again. A capture that fails (a buffer the ops could not find on the device) is abandoned
// and the update runs eagerly; after two such failures the optimizer stops capturing.
void Optimizer::apply(StepStats& st) {
  Backend& be = model_.backend();
  bool done = false;
  if (graph_ >= 0) {
    done = be.replay(graph_);
    if (done) {
      ++graph_replays_;
    } else {
      be.release_graph(graph_);
      graph_ = -1;
      settled_ = false;
    }
  } else if (graphs_ && settled_ && failed_captures_ < 2 && rules_host_free() && be.begin_capture()) {
    try {
      apply_ops();
      graph_ = be.end_capture();
    } catch (const Error& e) {
      be.abandon_capture();
      ++failed_captures_;
      capture_error_ = e.what();
      settled_ = false;
    }
    if (graph_ >= 0) {
      ++graph_captures_;
      if (!be.replay(graph_)) throw Error("optimizer: a graph just captured could not be replayed");  // capturing ran nothing
      ++graph_replays_;
      done = true;
    }
  }
  if (!done) {
    const int64_t before = be.resource_generation();
    apply_ops();
    settled_ = be.resource_generation() == before;
  }
  const ShardPlan& plan = sharding_.plan;
  st.swan = be.take_swan_stats();
  if (plan.sharded()) {
    broadcast_weights();
    double counts[3] = {static_cast<double>(st.swan.tensors), static_cast<double>(st.swan.unconverged),
                        static_cast<double>(st.swan.fallbacks)};
    sharding_.host->allreduce_sum(counts, 3);
    sharding_.host->allreduce_max(&st.swan.worst_residual, 1);
    st.swan.tensors = static_cast<int64_t>(counts[0]);
    st.swan.unconverged = static_cast<int64_t>(counts[1]);
    st.swan.fallbacks = static_cast<int64_t>(counts[2]);
  }
}

void Optimizer::apply_ops() {
  Backend& be = model_.backend();
  const ShardPlan& plan = sharding_.plan;
  // Clipping: the gradients this rank updates times the clip factor, read on the device (a launch
  // over each run of them; nothing happens when the factor is 1).
  if (run_.optimizer.grad_clip > 0) {
    if (!plan.sharded()) be.clip_gradients(model_.grads(), model_.num_params(), scalars_);
    else
      for (const OwnerRun& r : owner_runs(plan, model_.tensors(), 0, model_.num_params()))
        if (r.owner == plan.rank) be.clip_gradients(model_.grads().at(r.begin), r.end - r.begin, scalars_);
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
    ctx.seed = static_cast<uint64_t>(run_.seed);
    ctx.tensor = i;
    ctx.stochastic = run_.optimizer.rounding == "stochastic";
    ctx.scalars = {scalars_, slot_[i]};
    if (t.numel() <= kMultiTensorElements || rules_[i]->updates_large_tensors_together()) {
      auto& group = together[{rules_[i]->name(), assign_[i].matrix}];
      group.first = rules_[i].get();
      group.second.push_back({&t, model_.param(t), model_.grad(t), states_[i].data(), ctx});
      continue;
    }
    rules_[i]->update(be, t, model_.param(t), model_.grad(t), states_[i].data(), ctx);
  }
  for (const auto& [key, group] : together) group.first->update_many(be, group.second);
}

// Every owner broadcasts its tensors' new weights; consecutive tensors of one owner go as one
// broadcast.
void Optimizer::broadcast_weights() {
  for (const OwnerRun& r : owner_runs(sharding_.plan, model_.tensors(), 0, model_.num_params()))
    sharding_.weights->broadcast(model_.params().at(r.begin).ptr, r.end - r.begin, model_.dtype(), r.owner,
                                 "broadcast of updated weights from their owner");
  sharding_.weights->wait_all();
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
      model_.backend().to_host(mine.data(), states_[i][0].ptr, bytes);
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
    model_.backend().to_device(states_[i][0].ptr, bytes.data() + file_offset_[i], n);
  }
}

}  // namespace multinorm
