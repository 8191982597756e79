// The element-wise optimizers on the CPU: one fused pass over a tensor per rule (its Step:
// kernels/common/elementwise_rules.h), reading w, g and the states and writing them back. States
// are stored in their own dtype (BF16 as in the paper, or FP32), rounded to nearest.
#include <string>

#include "../common/elementwise_rules.h"
#include "cpu_kernels.h"
#include "multinorm/error.h"

namespace multinorm::cpu {

namespace {

// The states' pointers as named, non-overlapping locals, not read through an array inside the loop:
// with them in an array GCC kept the loop scalar (bench optim, llama_60m: Adam's matrices 56 ms,
// 8.7 ms vectorised).
template <class Step, int NS, class T, class G, class S>
void step_all(T* __restrict w, const G* __restrict g, S* const* states, int64_t n, const RuleScalars& r, const WriteBack& wb) {
  static_assert(NS <= 2, "step_all names two state pointers: add s2 for a rule with three states");
  S* __restrict s0 = NS > 0 ? states[0] : nullptr;
  S* __restrict s1 = NS > 1 ? states[1] : nullptr;
  auto one = [&](int64_t i, auto write) {
    float s[NS > 0 ? NS : 1];
    if constexpr (NS > 0) s[0] = to_f32(s0[i]);
    if constexpr (NS > 1) s[1] = to_f32(s1[i]);
    const float wi = Step::template apply<NS>(to_f32(w[i]), to_f32(g[i]), s, r);
    if constexpr (NS > 0) s0[i] = from_f32<S>(s[0]);
    if constexpr (NS > 1) s1[i] = from_f32<S>(s[1]);
    w[i] = write(wi, i);
  };
  if (!wb.stochastic) {  // one vector loop (stochastic rounding hashes each element's index)
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) one(i, [](float x, int64_t) { return from_f32<T>(x); });
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) one(i, [&](float x, int64_t at) { return write_weight<T>(x, wb, static_cast<uint64_t>(at)); });
}

}  // namespace

template <class Step, class T, class G, class S>
void elementwise_update(T* w, const G* g, S* const* states, int nstates, int64_t n, const RuleScalars& r, const WriteBack& wb) {
  if (nstates == Step::kStates) return step_all<Step, Step::kStates>(w, g, states, n, r, wb);
  if constexpr (Step::kStates == 1) {  // a rule that keeps its state only sometimes (SGD without momentum)
    if (nstates == 0) return step_all<Step, 0>(w, g, states, n, r, wb);
  }
  throw Error("elementwise update: " + std::to_string(nstates) + " state tensors, the rule keeps " + std::to_string(Step::kStates));
}

// Every rule of the list for (weights, gradients, states): FP32/FP32, BF16/BF16 and BF16 weights
// with FP32 gradients, each state dtype.
#define MULTINORM_INSTANTIATE_RULE(kind, Step, name, many_name)                                                                          \
  template void elementwise_update<Step, float, float, float>(float*, const float*, float* const*, int, int64_t, const RuleScalars&, \
                                                              const WriteBack&);                                             \
  template void elementwise_update<Step, float, float, bf16>(float*, const float*, bf16* const*, int, int64_t, const RuleScalars&,   \
                                                             const WriteBack&);                                              \
  template void elementwise_update<Step, bf16, bf16, float>(bf16*, const bf16*, float* const*, int, int64_t, const RuleScalars&,     \
                                                            const WriteBack&);                                               \
  template void elementwise_update<Step, bf16, bf16, bf16>(bf16*, const bf16*, bf16* const*, int, int64_t, const RuleScalars&,       \
                                                           const WriteBack&);                                                \
  template void elementwise_update<Step, bf16, float, float>(bf16*, const float*, float* const*, int, int64_t, const RuleScalars&,   \
                                                             const WriteBack&);                                              \
  template void elementwise_update<Step, bf16, float, bf16>(bf16*, const float*, bf16* const*, int, int64_t, const RuleScalars&,     \
                                                            const WriteBack&);
MULTINORM_ELEMENTWISE_RULES(MULTINORM_INSTANTIATE_RULE)
#undef MULTINORM_INSTANTIATE_RULE

}  // namespace multinorm::cpu
