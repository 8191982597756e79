// SWAN: stateless; the kernel is kernels/cpu/swan.cpp (math there and in docs/optimizers.md).
#include "../../kernels/common/optim_math.h"
#include "multinorm/optimizer.h"

namespace multinorm {

namespace {
class Swan final : public TensorRule {
 public:
  explicit Swan(const OptimizerConfig& c) : c_(c) {}
  std::string name() const override { return "swan"; }
  int state_slots() const override { return 0; }
  RuleScalars scalars(const UpdateContext& ctx) const override { return optim_math::rule_scalars(ctx.lr, static_cast<float>(c_.weight_decay)); }
  // Newton-Schulz's residual is read on the host inside the op (the tolerance, the statistics, the
  // exact fallback): not capturable in a graph.
  bool capturable() const override { return false; }
  bool matrices_only() const override { return true; }
  bool scales_lr_by_alpha() const override { return true; }
  void update(Backend& be, const TensorSpec& t, Buf w, Buf g, Buf*, const UpdateContext& ctx) const override {
    SwanArgs a;
    a.lr = ctx.lr;
    a.decoupled_decay = static_cast<float>(c_.weight_decay);
    a.standardize = c_.swan.row_norm == SwanRowNorm::Standardize;
    a.exact = c_.swan.whitening == SwanWhitening::Eigh;
    a.ns_steps = static_cast<int>(c_.swan.ns_steps);
    a.ns_tolerance = static_cast<float>(c_.swan.ns_tolerance);
    a.eps = static_cast<float>(c_.swan.eps);
    a.write = {ctx.stochastic, ctx.seed, static_cast<uint64_t>(ctx.update), ctx.tensor};
    a.scalars = ctx.scalars;
    be.swan_update(w, g, t.rows(), t.cols(), a);
  }

 private:
  OptimizerConfig c_;
};
}  // namespace

std::unique_ptr<TensorRule> make_swan(const OptimizerConfig& c) { return std::make_unique<Swan>(c); }

}  // namespace multinorm
