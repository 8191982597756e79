// The element-wise optimizers on the GPU: one generic kernel per rule (its Step:
// kernels/common/elementwise_rules.h, shared with the CPU; the same write-back rounding), for one
// tensor and for many small tensors in one launch. With an UpdateScalars (device memory) the scalars
// come from its slot when the kernel runs, and a skipped update writes nothing
// (take_update_scalars): one more 64-byte read per block, from L2.
//   Adam: reads w, g, m, v and writes w, m, v: per element sizeof(T) * 2 + sizeof(G) + 4 sizeof(S)
//         bytes (BF16 everything: 12 B), ~15 FLOPs
//   SGD:  reads w, g (+ buf) and writes w (+ buf): 2 sizeof(T) + sizeof(G) [+ 2 sizeof(S)] bytes
// A thread takes runs of 8 elements (16-byte packs of each BF16 array, two of each FP32 one) where
// every array is 16-byte aligned; a tensor's last n mod 8 elements, or unaligned arrays, one by one.
// Each element's arithmetic and its rounding index are the same either way: the same bits.
#include <algorithm>
#include <string>
#include <type_traits>

#include "../common/elementwise_rules.h"
#include "device_utils.cuh"
#include "kernels.h"
#include "multinorm/error.h"

namespace multinorm::cuda {

namespace {

constexpr int kRun = 8;  // elements a thread takes at once on the packed path

// The Step on P consecutive elements from e (P = kRun: whole packs; P = 1: one element).
template <class Step, int NS, int P, class T, class G, class S>
__device__ __forceinline__ void step_run(T* w, const G* g, S* const* st, int64_t e, const RuleScalars& r, const WriteBack& wb) {
  constexpr int kSlots = NS > 0 ? NS : 1;
  float wf[P], gf[P], sf[kSlots][P];
  load_values<T, P>(w, e, wf), load_values<G, P>(g, e, gf);
#pragma unroll
  for (int k = 0; k < NS; ++k) load_values<S, P>(st[k], e, sf[k]);
  T wo[P];
  S so[kSlots][P];
#pragma unroll
  for (int i = 0; i < P; ++i) {
    float s[kSlots];
#pragma unroll
    for (int k = 0; k < NS; ++k) s[k] = sf[k][i];
    wo[i] = store_weight<T>(Step::template apply<NS>(wf[i], gf[i], s, r), wb, static_cast<uint64_t>(e + i));
#pragma unroll
    for (int k = 0; k < NS; ++k) so[k][i] = from_float<S>(s[k]);
  }
#pragma unroll
  for (int k = 0; k < NS; ++k) store_packs<S, P>(st[k], e, so[k]);
  store_packs<T, P>(w, e, wo);
}

// Elements begin..end-1 of one tensor by `threads` threads from `thread`: runs of kRun where the
// arrays allow.
template <class Step, int NS, class T, class G, class S>
__device__ void step_range(T* w, const G* g, S* const* st, int64_t begin, int64_t end, int64_t threads, int64_t thread, const RuleScalars& r,
                           const WriteBack& wb) {
  bool packed = aligned16(w) && aligned16(g) && begin % kRun == 0;
#pragma unroll
  for (int k = 0; k < NS; ++k) packed = packed && aligned16(st[k]);
  int64_t tail = begin;
  if (packed) {
    const int64_t runs = (end - begin) / kRun;
    for (int64_t k = thread; k < runs; k += threads) step_run<Step, NS, kRun>(w, g, st, begin + k * kRun, r, wb);
    tail = begin + runs * kRun;
  }
  for (int64_t e = tail + thread; e < end; e += threads) step_run<Step, NS, 1>(w, g, st, e, r, wb);
}

template <class Step, int NS, class T, class G, class S>
__global__ void step_kernel(T* w, const G* g, ElementwiseStates<S> st, int64_t n, RuleScalars r, WriteBack wb, const UpdateScalars* s, int slot) {
  if (!take_update_scalars(s, slot, r, wb)) return;
  step_range<Step, NS>(w, g, st.p, 0, n, int64_t(gridDim.x) * blockDim.x, blockIdx.x * int64_t(blockDim.x) + threadIdx.x, r, wb);
}

// One launch over many tensors: block b serves the item whose block range holds b (a short scan of
// at most kElementwiseManyPerLaunch items, L2-resident), kElementwiseManyElementsPerBlock elements each.
template <class Step, int NS, class T, class G, class S>
__global__ void step_many_kernel(const ElementwiseManyItem* items, int64_t count, RuleScalars r, WriteBack wb, const UpdateScalars* s, int slot) {
  if (!take_update_scalars(s, slot, r, wb)) return;
  int64_t i = 0;
  while (i + 1 < count && items[i + 1].first_block <= int64_t(blockIdx.x)) ++i;
  const ElementwiseManyItem it = items[i];
  wb.tensor = it.tensor;
  const int64_t begin = (int64_t(blockIdx.x) - it.first_block) * kElementwiseManyElementsPerBlock;
  const int64_t end = begin + kElementwiseManyElementsPerBlock < it.n ? begin + kElementwiseManyElementsPerBlock : it.n;
  S* st[kMaxElementwiseStates] = {static_cast<S*>(it.states[0]), static_cast<S*>(it.states[1])};
  step_range<Step, NS>(static_cast<T*>(it.w), static_cast<const G*>(it.g), st, begin, end, blockDim.x, threadIdx.x, r, wb);
}

unsigned grid_for(int64_t n) { return static_cast<unsigned>(std::min<int64_t>(ceil_div(n, 256), 8192)); }

// The kernel for the tensor's state count: the Step's own, or none where its rule keeps its state
// only sometimes (SGD without momentum).
template <class Step, class Fn>
void with_state_count(int states, const char* name, Fn&& fn) {
  if (states == Step::kStates) return fn(std::integral_constant<int, Step::kStates>());
  if constexpr (Step::kStates == 1)
    if (states == 0) return fn(std::integral_constant<int, 0>());
  throw Error(std::string(name) + ": " + std::to_string(states) + " state tensors, the rule keeps " + std::to_string(Step::kStates));
}

}  // namespace

template <class Step, class T, class G, class S>
void elementwise(const char* name, T* w, const G* g, ElementwiseStates<S> st, int states, int64_t n, const RuleScalars& r, const WriteBack& wb,
                 ScalarsRef s, cudaStream_t stream) {
  if (n <= 0) return;
  with_state_count<Step>(states, name, [&](auto ns) {
    launch(name, step_kernel<Step, decltype(ns)::value, T, G, S>, dim3(grid_for(n)), dim3(256), 0, stream, w, g, st, n, r, wb, s.at, s.slot);
  });
}
template <class Step, class T, class G, class S>
void elementwise_many(const char* name, const ElementwiseManyItem* items, int states, int64_t count, int64_t blocks, const RuleScalars& r,
                      const WriteBack& wb, ScalarsRef s, cudaStream_t stream) {
  if (count <= 0 || blocks <= 0) return;
  with_state_count<Step>(states, name, [&](auto ns) {
    launch(name, step_many_kernel<Step, decltype(ns)::value, T, G, S>, dim3(static_cast<unsigned>(blocks)), dim3(256), 0, stream, items, count, r,
           wb, s.at, s.slot);
  });
}

// (weights, gradients, states) as the CPU backend instantiates them, for every rule of the list.
#define MULTINORM_INSTANTIATE(Step, T, G, S)                                                                                         \
  template void elementwise<Step, T, G, S>(const char*, T*, const G*, ElementwiseStates<S>, int, int64_t, const RuleScalars&,          \
                                           const WriteBack&, ScalarsRef, cudaStream_t);                                             \
  template void elementwise_many<Step, T, G, S>(const char*, const ElementwiseManyItem*, int, int64_t, int64_t, const RuleScalars&,  \
                                                const WriteBack&, ScalarsRef, cudaStream_t);
#define MULTINORM_INSTANTIATE_RULE(kind, Step, name, many_name) \
  MULTINORM_INSTANTIATE(Step, float, float, float)   \
  MULTINORM_INSTANTIATE(Step, float, float, bf16)    \
  MULTINORM_INSTANTIATE(Step, bf16, bf16, float)     \
  MULTINORM_INSTANTIATE(Step, bf16, bf16, bf16)      \
  MULTINORM_INSTANTIATE(Step, bf16, float, float)    \
  MULTINORM_INSTANTIATE(Step, bf16, float, bf16)
MULTINORM_ELEMENTWISE_RULES(MULTINORM_INSTANTIATE_RULE)
#undef MULTINORM_INSTANTIATE_RULE
#undef MULTINORM_INSTANTIATE

}  // namespace multinorm::cuda
