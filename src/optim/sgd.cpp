// SGD with optional momentum (torch.optim.SGD, dampening 0): one state tensor when momentum > 0.
#include "../../kernels/common/optim_math.h"
#include "multinorm/optimizer.h"

namespace multinorm {

namespace {
class Sgd final : public TensorRule {
 public:
  explicit Sgd(const OptimizerConfig& c) : c_(c) {}
  std::string name() const override { return "sgd"; }
  int state_slots() const override { return c_.momentum > 0 ? 1 : 0; }
  RuleScalars scalars(const UpdateContext& ctx) const override { return optim_math::rule_scalars(args(ctx)); }
  void update(OptimizerKernels& kernels, const TensorSpec& t, Buf w, Buf g, Buf* states, const UpdateContext& ctx) const override {
    kernels.sgd_update(w, g, c_.momentum > 0 ? states[0] : Buf{nullptr, w.dtype}, t.numel(), args(ctx), t.cols());
  }

 private:
  SgdArgs args(const UpdateContext& ctx) const {
    SgdArgs a;
    a.lr = ctx.lr;
    a.momentum = static_cast<float>(c_.momentum);
    a.decoupled_decay = static_cast<float>(c_.weight_decay);
    a.write = {ctx.stochastic, ctx.seed, static_cast<uint64_t>(ctx.update), ctx.tensor};
    a.scalars = ctx.scalars;
    return a;
  }
  OptimizerConfig c_;
};
}  // namespace

std::unique_ptr<TensorRule> make_sgd(const OptimizerConfig& c) { return std::make_unique<Sgd>(c); }

}  // namespace multinorm
