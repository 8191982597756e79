// One optimizer update over every parameter: schedule, optional clipping, each tensor's rule.
#include "multinorm/optimizer.h"

#include <cmath>
#include <map>

#include "../../kernels/cuda/scratch_sizes.h"
#include "multinorm/error.h"
#include "multinorm/schedule.h"

namespace multinorm {

namespace {
// Tensors up to this many elements go into multi-tensor updates (every norm weight of the paper's
// models: at most 8192 elements; the matrices and embeddings are far larger).
constexpr int64_t kMultiTensorElements = cuda_scratch::kMultiTensorElements;
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
  Backend& be = model_.backend();
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

Optimizer::~Optimizer() { model_.backend().release(arena_); }

double Optimizer::measure_gradient_norm(int64_t update) {
  Backend& be = model_.backend();
  const ShardPlan& plan = sharding_.plan;
  // The global norm from per-tensor sums of squares added in tensor order: the same FP64 number
  // whether one rank holds every reduced gradient or each owner its own (the others add zeros).
  // One backend call for the rank's tensors: a device reads the sums back once, not once per tensor.
  std::vector<double> squares(assign_.size(), 0.0);
  std::vector<size_t> mine;
  std::vector<Buf> grads;
  std::vector<int64_t> sizes;
  for (size_t i = 0; i < assign_.size(); ++i)
    if (plan.mine(i)) mine.push_back(i), grads.push_back(model_.grad(*assign_[i].tensor)), sizes.push_back(assign_[i].tensor->numel());
  std::vector<double> mine_squares(mine.size());
  be.sum_squares_many(grads.data(), sizes.data(), static_cast<int64_t>(mine.size()), mine_squares.data());
  for (size_t k = 0; k < mine.size(); ++k) squares[mine[k]] = mine_squares[k];
  if (plan.sharded()) sharding_.host->allreduce_sum(squares.data(), static_cast<int64_t>(squares.size()));
  double sum = 0;
  for (double q : squares) sum += q;
  measured_norm_ = std::sqrt(sum);
  measured_update_ = update;
  measured_version_ = model_.gradient_version();
  return measured_norm_;
}

StepStats Optimizer::step(int64_t update, int64_t applied) {
  Backend& be = model_.backend();
  const ShardPlan& plan = sharding_.plan;
  StepStats st;
  st.lr_multiplier = schedule_multiplier(run_.schedule, update);
  const double lr_t = run_.optimizer.lr * lr_scale_ * st.lr_multiplier;
  const bool scaled = run_.optimizer.name == "sinkgd" || run_.optimizer.name == "swan";
  st.lr_matrix = lr_t * (scaled ? run_.optimizer.alpha : 1.0);
  st.lr_fallback = lr_t;
  if (measured_update_ != update || measured_version_ != model_.gradient_version()) measure_gradient_norm(update);
  measured_update_ = -1;  // an update's gradients are measured for one step
  st.grad_norm = measured_norm_;
  if (!std::isfinite(st.grad_norm)) return st;  // the trainer decides (stop or skip); nothing is applied
  const bool clip = run_.optimizer.grad_clip > 0 && st.grad_norm > run_.optimizer.grad_clip;
  st.clipped = clip;
  const float clip_factor = clip ? static_cast<float>(run_.optimizer.grad_clip / st.grad_norm) : 1.0f;
  // Small tensors (the norm weights) of one rule and learning rate are updated together: one
  // backend call, one launch on a device; so are all the tensors of a rule that asks for it (SinkGD:
  // the CPU overlaps one tensor's memory traffic with another's passes). Tensors are independent,
  // so the order does not matter.
  std::map<std::pair<std::string, bool>, std::pair<const TensorRule*, std::vector<RuleItem>>> together;
  for (size_t i = 0; i < assign_.size(); ++i) {
    if (!plan.mine(i)) continue;
    const TensorSpec& t = *assign_[i].tensor;
    if (clip) be.scale(model_.grad(t), t.numel(), clip_factor);
    UpdateContext ctx;
    ctx.lr = static_cast<float>(assign_[i].matrix ? st.lr_matrix : st.lr_fallback);
    ctx.update = update;
    ctx.applied = applied;
    ctx.seed = static_cast<uint64_t>(run_.seed);
    ctx.tensor = i;
    ctx.stochastic = run_.optimizer.rounding == "stochastic";
    if (t.numel() <= kMultiTensorElements || rules_[i]->updates_large_tensors_together()) {
      auto& group = together[{rules_[i]->name(), assign_[i].matrix}];
      group.first = rules_[i].get();
      group.second.push_back({&t, model_.param(t), model_.grad(t), states_[i].data(), ctx});
      continue;
    }
    rules_[i]->update(be, t, model_.param(t), model_.grad(t), states_[i].data(), ctx);
  }
  for (const auto& [key, group] : together) group.first->update_many(be, group.second);
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
  return st;
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
