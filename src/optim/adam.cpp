// Adam and AdamW (torch.optim semantics): two state tensors, m and v; the step is the element-wise
// list's AdamStep (kernels/common/elementwise_rules.h). `adam` applies optimizer.weight_decay as
// torch.optim.Adam does (L2, added to the gradient); `adamw` decoupled, as torch.optim.AdamW.
#include "../../kernels/common/optim_math.h"
#include "multinorm/optimizer.h"

namespace multinorm {

namespace {
class Adam final : public TensorRule {
 public:
  Adam(const OptimizerConfig& c, bool decoupled) : c_(c), decoupled_(decoupled) {}
  std::string name() const override { return decoupled_ ? "adamw" : "adam"; }
  int state_slots() const override { return 2; }
  RuleScalars scalars(const UpdateContext& ctx) const override { return optim_math::rule_scalars(args(ctx)); }
  void update(OptimizerKernels& kernels, const TensorSpec& t, Buf w, Buf g, Buf* states, const UpdateContext& ctx) const override {
    kernels.adam_update(w, g, states[0], states[1], t.numel(), args(ctx), t.cols());
  }
  void update_many(OptimizerKernels& kernels, const std::vector<RuleItem>& items) const override {
    std::vector<AdamTensor> tensors;
    tensors.reserve(items.size());
    for (const RuleItem& it : items)
      tensors.push_back({it.w, it.g, it.states[0], it.states[1], it.tensor->numel(), it.ctx.tensor, it.tensor->cols()});
    if (!tensors.empty()) kernels.adam_update_many(tensors.data(), static_cast<int64_t>(tensors.size()), args(items.front().ctx));
  }

 private:
  AdamArgs args(const UpdateContext& ctx) const {
    AdamArgs a;
    a.lr = ctx.lr;
    a.beta1 = c_.adam.beta1;
    a.beta2 = c_.adam.beta2;
    a.eps = static_cast<float>(c_.adam.eps);
    (decoupled_ ? a.decoupled_decay : a.l2_decay) = static_cast<float>(c_.weight_decay);
    a.step = ctx.applied;  // skipped updates do not advance the bias correction
    a.write = {ctx.stochastic, ctx.seed, static_cast<uint64_t>(ctx.update), ctx.tensor};
    a.scalars = ctx.scalars;
    return a;
  }

  OptimizerConfig c_;
  bool decoupled_;
};
}  // namespace

std::unique_ptr<TensorRule> make_adam(const OptimizerConfig& c) { return std::make_unique<Adam>(c, false); }
std::unique_ptr<TensorRule> make_adamw(const OptimizerConfig& c) { return std::make_unique<Adam>(c, true); }

}  // namespace multinorm
