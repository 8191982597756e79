// The CPU backend's optimizer kernels (cpu_optimizer_kernels.h).
#include "cpu_optimizer_kernels.h"

#include "../common/dtype_dispatch.h"
#include "../common/elementwise_rules.h"
#include "../common/optim_math.h"

namespace multinorm::cpu {

namespace {

using dispatch::as;

// The update's scalars (host memory here) into an op's arguments: its slot's learning rate and the
// write step; false when the update is skipped. The kernels derive keep (and Adam's scalars, taken
// from the slot above) from them as the slot's were formed (optim_math::rule_scalars).
template <class Args>
bool resolve(Args& a) {
  if (!a.scalars.at) return true;
  const UpdateScalars& s = *a.scalars.at;
  if (s.stats.skip) return false;
  a.lr = s.rule[a.scalars.slot].lr;
  a.write.step = s.update;
  return true;
}

}  // namespace

double CpuOptimizerKernels::sum_squares(Buf x, int64_t n) {
  double r = 0;
  dispatch::with_type<bf16>(x.dtype, [&](auto* t) { r = cpu::sum_squares(as<std::remove_pointer_t<decltype(t)>>(x), n); });
  return r;
}
void CpuOptimizerKernels::scale(Buf x, int64_t n, float factor) {
  dispatch::with_type<bf16>(x.dtype, [&](auto* t) { cpu::scale(as<std::remove_pointer_t<decltype(t)>>(x), n, factor); });
}
void CpuOptimizerKernels::sum_squares_many(const Buf* xs, const int64_t* ns, int64_t count, double* out) {
  for (int64_t i = 0; i < count; ++i) out[i] = sum_squares(xs[i], ns[i]);
}
// The statistics in host memory: the same numbers as the CUDA kernels' (finish_statistics).
void CpuOptimizerKernels::update_statistics(UpdateScalars* s, const LossTotals* loss, const double* squares, int64_t count, double grad_clip) {
  s->stats = optim_math::finish_statistics(squares, count, *loss, *s, grad_clip);
}
void CpuOptimizerKernels::clip_gradients(Buf x, int64_t n, const UpdateScalars* s) {
  if (!s->stats.skip && s->stats.clip_factor != 1.0f) scale(x, n, s->stats.clip_factor);
}
void CpuOptimizerKernels::sinkgd_update(Buf w, Buf g, int64_t m, int64_t n, const SinkGDArgs& in) {
  SinkGDArgs args = in;
  if (!resolve(args)) return;
  dispatch::with_types<bf16>(w.dtype, g.dtype, "sinkgd_update", [&](auto* t, auto* gt) {
    using T = std::remove_pointer_t<decltype(t)>;
    using G = std::remove_pointer_t<decltype(gt)>;
    cpu::sinkgd_update(as<T>(w), as<G>(g), m, n, args, ws_);
  });
}
void CpuOptimizerKernels::sinkgd_update_many(const SinkGDTensor* tensors, int64_t count, const SinkGDArgs& in) {
  SinkGDArgs args = in;
  if (resolve(args)) cpu::sinkgd_update_many(tensors, count, args, ws_);
}
void CpuOptimizerKernels::swan_update_many(const SwanTensor* tensors, int64_t count, const SwanArgs& in) {
  SwanArgs args = in;
  if (!resolve(args)) return;  // a skipped update: nothing applied, nothing counted
  for (int64_t i = 0; i < count; ++i) {
    const SwanTensor& t = tensors[i];
    args.write.tensor = t.tensor;
    dispatch::with_types<bf16>(t.w.dtype, t.g.dtype, "swan_update", [&](auto* w, auto* g) {
      using T = std::remove_pointer_t<decltype(w)>;
      using G = std::remove_pointer_t<decltype(g)>;
      const cpu::SwanReport r = cpu::swan_update(as<T>(t.w), as<G>(t.g), t.m, t.n, args, gemm_, ws_);
      if (args.stats) optim_math::add_swan_tensor(*args.stats, r.residual, r.fell_back, r.steps, args.exact ? 0.0f : args.ns_tolerance);
    });
  }
}
// The update's scalars from its slot (host memory here) where the update has them: the Steps read
// their rule's scalars as the slot's were formed (optim_math::rule_scalars).
void CpuOptimizerKernels::elementwise_update_many(ElementwiseKind kind, const ElementwiseTensor* tensors, int64_t count,
                                                  const ElementwiseArgs& args) {
  RuleScalars r = args.rule;
  WriteBack wb = args.write;
  if (args.scalars.at) {
    const UpdateScalars& s = *args.scalars.at;
    if (s.stats.skip) return;
    r = s.rule[args.scalars.slot];
    wb.step = s.update;
  }
  for (int64_t i = 0; i < count; ++i) {  // OpenMP parallelises within each tensor
    const ElementwiseTensor& t = tensors[i];
    wb.tensor = t.tensor;
    dispatch::with_types<bf16>(t.w.dtype, t.g.dtype, "elementwise_update", [&](auto* w, auto* g) {
      using T = std::remove_pointer_t<decltype(w)>;
      using G = std::remove_pointer_t<decltype(g)>;
      dispatch::with_type<bf16>(elementwise::state_dtype(t), [&](auto* st) {
        using S = std::remove_pointer_t<decltype(st)>;
        S* states[kMaxElementwiseStates] = {};
        for (int k = 0; k < t.nstates; ++k) states[k] = as<S>(t.states[k]);
        switch (kind) {
#define MULTINORM_CASE(kind_, Step, name, many_name) \
  case kind_:                                      \
    return cpu::elementwise_update<Step>(as<T>(t.w), as<G>(t.g), states, t.nstates, t.n, r, wb);
          MULTINORM_ELEMENTWISE_RULES(MULTINORM_CASE)
#undef MULTINORM_CASE
        }
      });
    });
  }
}

}  // namespace multinorm::cpu
