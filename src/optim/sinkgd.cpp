// SinkGD: stateless; the fused kernel is kernels/cpu/sinkgd.cpp (math there and in docs/optimizers.md).
#include "../../kernels/common/optim_math.h"
#include "multinorm/optimizer.h"

namespace multinorm {

namespace {
class SinkGD final : public TensorRule {
 public:
  explicit SinkGD(const OptimizerConfig& c) : c_(c) {}
  std::string name() const override { return "sinkgd"; }
  int state_slots() const override { return 0; }
  RuleScalars scalars(const UpdateContext& ctx) const override { return optim_math::rule_scalars(ctx.lr, static_cast<float>(c_.weight_decay)); }
  bool matrices_only() const override { return true; }
  bool scales_lr_by_alpha() const override { return true; }
  void update(OptimizerKernels& kernels, const TensorSpec& t, Buf w, Buf g, Buf*, const UpdateContext& ctx) const override {
    kernels.sinkgd_update(w, g, t.rows(), t.cols(), args(ctx));
  }
  // Every matrix in one call: the CPU backend runs whole tensors on separate cores.
  bool updates_large_tensors_together() const override { return true; }
  void update_many(OptimizerKernels& kernels, const std::vector<RuleItem>& items) const override {
    std::vector<SinkGDTensor> tensors;
    tensors.reserve(items.size());
    for (const RuleItem& it : items) tensors.push_back({it.w, it.g, it.tensor->rows(), it.tensor->cols(), it.ctx.tensor});
    if (!tensors.empty()) kernels.sinkgd_update_many(tensors.data(), static_cast<int64_t>(tensors.size()), args(items.front().ctx));
  }

 private:
  SinkGDArgs args(const UpdateContext& ctx) const {
    SinkGDArgs a;
    a.lr = ctx.lr;
    a.decoupled_decay = static_cast<float>(c_.weight_decay);
    a.iterations = static_cast<int>(c_.sinkgd.iterations);
    a.eps = static_cast<float>(c_.sinkgd.eps);
    a.write = {ctx.stochastic, ctx.seed, static_cast<uint64_t>(ctx.update), ctx.tensor};
    a.scalars = ctx.scalars;
    return a;
  }

  OptimizerConfig c_;
};
}  // namespace

std::unique_ptr<TensorRule> make_sinkgd(const OptimizerConfig& c) { return std::make_unique<SinkGD>(c); }

}  // namespace multinorm
