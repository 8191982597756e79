// SinkGD: stateless; the fused kernel is kernels/cpu/sinkgd.cpp (math there and in docs/optimizers.md).
#include "multinorm/optimizer.h"

namespace multinorm {

namespace {
class SinkGD final : public TensorRule {
 public:
  explicit SinkGD(const OptimizerConfig& c) : c_(c) {}
  std::string name() const override { return "sinkgd"; }
  int state_slots() const override { return 0; }
  bool matrices_only() const override { return true; }
  void update(Backend& be, const TensorSpec& t, Buf w, Buf g, Buf*, const UpdateContext& ctx) const override {
    SinkGDArgs a;
    a.lr = ctx.lr;
    a.decoupled_decay = static_cast<float>(c_.weight_decay);
    a.iterations = static_cast<int>(c_.sinkgd.iterations);
    a.eps = static_cast<float>(c_.sinkgd.eps);
    a.write = {ctx.stochastic, ctx.seed, static_cast<uint64_t>(ctx.update), ctx.tensor};
    be.sinkgd_update(w, g, t.rows(), t.cols(), a);
  }

 private:
  OptimizerConfig c_;
};
}  // namespace

std::unique_ptr<TensorRule> make_sinkgd(const OptimizerConfig& c) { return std::make_unique<SinkGD>(c); }

}  // namespace multinorm
