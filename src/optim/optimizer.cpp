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

Optimizer::Optimizer(LlamaModel& model, const RunConfig& run)
    : model_(model), run_(run), state_dtype_(run.precision.optimizer_states) {
  assign_ = assign_optimizers(model.tensors(), run.optimizer);
  int64_t elements = 0;
  for (const auto& a : assign_) {
    rules_.push_back(make_rule(a.optimizer, run.optimizer));
    const int64_t n = a.tensor->numel() * rules_.back()->state_slots();
    elements += n;
    if (a.matrix) matrix_state_bytes_ += n * dtype_bytes(state_dtype_);
  }
  state_bytes_ = elements * dtype_bytes(state_dtype_);
  Backend& be = model_.backend();
  arena_ = be.allocate(std::max<int64_t>(state_bytes_, 1));
  Buf cursor{arena_, state_dtype_};
  for (size_t i = 0; i < assign_.size(); ++i) {
    std::vector<Buf> s;
    for (int k = 0; k < rules_[i]->state_slots(); ++k) {
      s.push_back(cursor);
      cursor = cursor.at(assign_[i].tensor->numel());
    }
    states_.push_back(std::move(s));
  }
}

Optimizer::~Optimizer() { model_.backend().release(arena_); }

StepStats Optimizer::step(int64_t update, int64_t applied) {
  Backend& be = model_.backend();
  StepStats st;
  st.lr_multiplier = schedule_multiplier(run_.schedule, update);
  const double lr_t = run_.optimizer.lr * st.lr_multiplier;
  const bool scaled = run_.optimizer.name == "sinkgd" || run_.optimizer.name == "swan";
  st.lr_matrix = lr_t * (scaled ? run_.optimizer.alpha : 1.0);
  st.lr_fallback = lr_t;
  // The gradient arena is contiguous: one reduction gives the global norm.
  st.grad_norm = std::sqrt(be.sum_squares(model_.grads(), model_.num_params()));
  if (!std::isfinite(st.grad_norm)) return st;  // the trainer decides (stop or skip); nothing is applied
  if (run_.optimizer.grad_clip > 0 && st.grad_norm > run_.optimizer.grad_clip) {
    be.scale(model_.grads(), model_.num_params(), static_cast<float>(run_.optimizer.grad_clip / st.grad_norm));
    st.clipped = true;
  }
  // Small tensors (the norm weights) of one rule and learning rate are updated together: one
  // backend call, one launch on a device. Tensors are independent, so the order does not matter.
  std::map<std::pair<std::string, bool>, std::pair<const TensorRule*, std::vector<RuleItem>>> small;
  for (size_t i = 0; i < assign_.size(); ++i) {
    const TensorSpec& t = *assign_[i].tensor;
    UpdateContext ctx;
    ctx.lr = static_cast<float>(assign_[i].matrix ? st.lr_matrix : st.lr_fallback);
    ctx.update = update;
    ctx.applied = applied;
    ctx.seed = static_cast<uint64_t>(run_.seed);
    ctx.tensor = i;
    ctx.stochastic = run_.optimizer.rounding == "stochastic";
    if (t.numel() <= kMultiTensorElements) {
      auto& group = small[{rules_[i]->name(), assign_[i].matrix}];
      group.first = rules_[i].get();
      group.second.push_back({&t, model_.param(t), model_.grad(t), states_[i].data(), ctx});
      continue;
    }
    rules_[i]->update(be, t, model_.param(t), model_.grad(t), states_[i].data(), ctx);
  }
  for (const auto& [key, group] : small) group.first->update_many(be, group.second);
  st.swan = be.take_swan_stats();
  return st;
}

std::vector<uint8_t> Optimizer::states_to_host() const {
  std::vector<uint8_t> out(state_bytes_);
  if (state_bytes_) model_.backend().to_host(out.data(), arena_, state_bytes_);
  return out;
}

void Optimizer::states_from_host(const std::vector<uint8_t>& bytes) {
  if (static_cast<int64_t>(bytes.size()) != state_bytes_)
    throw Error("optimizer state: expected " + std::to_string(state_bytes_) + " bytes, got " + std::to_string(bytes.size()));
  if (state_bytes_) model_.backend().to_device(arena_, bytes.data(), state_bytes_);
}

}  // namespace multinorm
