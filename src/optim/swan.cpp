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
  bool matrices_only() const override { return true; }
  bool scales_lr_by_alpha() const override { return true; }
  // Every matrix in one call: a device batches the Newton-Schulz products of one Gram size.
  bool updates_large_tensors_together() const override { return true; }
  void update(OptimizerKernels& kernels, const TensorSpec& t, Buf w, Buf g, Buf*, const UpdateContext& ctx) const override {
    const SwanArgs a = args(ctx);
    kernels.swan_update(w, g, t.rows(), t.cols(), a);
  }
  void update_many(OptimizerKernels& kernels, const std::vector<RuleItem>& items) const override {
    if (items.empty()) return;
    std::vector<SwanTensor> tensors;
    for (const RuleItem& it : items) tensors.push_back({it.w, it.g, it.tensor->rows(), it.tensor->cols(), it.ctx.tensor});
    kernels.swan_update_many(tensors.data(), static_cast<int64_t>(tensors.size()), args(items.front().ctx));
  }

 private:
  SwanArgs args(const UpdateContext& ctx) const {
    SwanArgs a;
    a.lr = ctx.lr;
    a.decoupled_decay = static_cast<float>(c_.weight_decay);
    a.standardize = c_.swan.row_norm == SwanRowNorm::Standardize;
    a.exact = c_.swan.whitening == SwanWhitening::Eigh;
    a.ns_steps = static_cast<int>(c_.swan.ns_steps);
    a.ns_tolerance = static_cast<float>(c_.swan.ns_tolerance);
    a.ns_products = c_.swan.ns_products;
    a.eps = static_cast<float>(c_.swan.eps);
    a.write = {ctx.stochastic, ctx.seed, static_cast<uint64_t>(ctx.update), ctx.tensor};
    a.scalars = ctx.scalars;
    a.stats = ctx.swan_stats;
    return a;
  }
  OptimizerConfig c_;
};
}  // namespace

std::unique_ptr<TensorRule> make_swan(const OptimizerConfig& c) { return std::make_unique<Swan>(c); }

}  // namespace multinorm
