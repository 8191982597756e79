// The elementwise optimizers, one pass each (Adam's per-element step and scalars:
// kernels/common/optim_math.h, shared with the CPU; the same write-back rounding). With an
// UpdateScalars (device memory) the scalars come from its slot when the kernel runs, and a skipped
// update writes nothing (take_update_scalars): one more 64-byte read per block, from L2.
//   Adam: reads w, g, m, v and writes w, m, v: per element sizeof(T) * 2 + sizeof(G) + 4 sizeof(S)
//         bytes (BF16 everything: 12 B), ~15 FLOPs
//   SGD:  reads w, g (+ buf) and writes w (+ buf): 2 sizeof(T) + sizeof(G) [+ 2 sizeof(S)] bytes
// A thread takes runs of 8 elements (16-byte packs of each BF16 array, two of each FP32 one) where
// every array is 16-byte aligned; a tensor's last n mod 8 elements, or unaligned arrays, one by one.
// Each element's arithmetic and its rounding index are the same either way: the same bits.
#include "device_utils.cuh"
#include "kernels.h"

namespace multinorm::cuda {

namespace {

constexpr int kRun = 8;  // elements a thread takes at once on the packed path

template <class T, class G, class S>
__device__ __forceinline__ bool packable_arrays(const T* w, const G* g, const S* m, const S* v) {
  return (reinterpret_cast<uintptr_t>(w) | reinterpret_cast<uintptr_t>(g) | reinterpret_cast<uintptr_t>(m) | reinterpret_cast<uintptr_t>(v)) %
             16 ==
         0;
}

// Adam on P consecutive elements from e (P = kRun: whole packs; P = 1: one element).
template <int P, class T, class G, class S>
__device__ __forceinline__ void adam_run(T* w, const G* g, S* m, S* v, int64_t e, const AdamScalars& a, const WriteBack& wb) {
  float wf[P], gf[P], mf[P], vf[P];
  load_values<T, P>(w, e, wf), load_values<G, P>(g, e, gf), load_values<S, P>(m, e, mf), load_values<S, P>(v, e, vf);
  T wo[P];
  S mo[P], vo[P];
#pragma unroll
  for (int k = 0; k < P; ++k) {
    wo[k] = store_weight<T>(optim_math::adam_element(wf[k], gf[k], mf[k], vf[k], a), wb, static_cast<uint64_t>(e + k));
    mo[k] = from_float<S>(mf[k]), vo[k] = from_float<S>(vf[k]);
  }
  store_packs<S, P>(m, e, mo), store_packs<S, P>(v, e, vo), store_packs<T, P>(w, e, wo);
}

// Elements begin..end-1 of one tensor by the block's threads: runs of kRun where the arrays allow.
template <class T, class G, class S>
__device__ void adam_range(T* w, const G* g, S* m, S* v, int64_t begin, int64_t end, int64_t stride_threads, int64_t thread,
                           const AdamScalars& a, const WriteBack& wb) {
  int64_t tail = begin;
  if (packable_arrays(w, g, m, v) && begin % kRun == 0) {
    const int64_t runs = (end - begin) / kRun;
    for (int64_t k = thread; k < runs; k += stride_threads) adam_run<kRun>(w, g, m, v, begin + k * kRun, a, wb);
    tail = begin + runs * kRun;
  }
  for (int64_t e = tail + thread; e < end; e += stride_threads) adam_run<1>(w, g, m, v, e, a, wb);
}

template <class T, class G, class S>
__global__ void adam_kernel(T* w, const G* g, S* m, S* v, int64_t n, RuleScalars r, WriteBack wb, const UpdateScalars* s, int slot) {
  if (!take_update_scalars(s, slot, r, wb)) return;
  adam_range(w, g, m, v, 0, n, int64_t(gridDim.x) * blockDim.x, blockIdx.x * int64_t(blockDim.x) + threadIdx.x, r.adam, wb);
}

// One launch over many tensors: block b serves the item whose block range holds b (a short scan of
// at most kAdamManyPerLaunch items, L2-resident), kAdamManyElementsPerBlock elements each.
template <class T, class G, class S>
__global__ void adam_many_kernel(const AdamManyItem* items, int64_t count, RuleScalars r, WriteBack wb, const UpdateScalars* s, int slot) {
  if (!take_update_scalars(s, slot, r, wb)) return;
  int64_t i = 0;
  while (i + 1 < count && items[i + 1].first_block <= int64_t(blockIdx.x)) ++i;
  const AdamManyItem it = items[i];
  wb.tensor = it.tensor;
  const int64_t begin = (int64_t(blockIdx.x) - it.first_block) * kAdamManyElementsPerBlock;
  const int64_t end = begin + kAdamManyElementsPerBlock < it.n ? begin + kAdamManyElementsPerBlock : it.n;
  adam_range(static_cast<T*>(it.w), static_cast<const G*>(it.g), static_cast<S*>(it.m), static_cast<S*>(it.v), begin, end, blockDim.x,
             threadIdx.x, r.adam, wb);
}

// SGD (with momentum when buf) on P consecutive elements from i.
template <int P, class T, class G, class S>
__device__ __forceinline__ void sgd_run(T* w, const G* g, S* buf, int64_t i, float lr, float keep, float momentum, const WriteBack& wb) {
  float wf[P], d[P];
  load_values<T, P>(w, i, wf), load_values<G, P>(g, i, d);
  if (buf) {
    float b[P];
    load_values<S, P>(buf, i, b);
    S bo[P];
#pragma unroll
    for (int k = 0; k < P; ++k) d[k] = momentum * b[k] + d[k], bo[k] = from_float<S>(d[k]);
    store_packs<S, P>(buf, i, bo);
  }
  T wo[P];
#pragma unroll
  for (int k = 0; k < P; ++k) wo[k] = store_weight<T>(wf[k] * keep - lr * d[k], wb, static_cast<uint64_t>(i + k));
  store_packs<T, P>(w, i, wo);
}

template <class T, class G, class S>
__global__ void sgd_kernel(T* w, const G* g, S* buf, int64_t n, RuleScalars r, float momentum, WriteBack wb, const UpdateScalars* s, int slot) {
  if (!take_update_scalars(s, slot, r, wb)) return;
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x, stride = int64_t(gridDim.x) * blockDim.x;
  const bool packed = aligned16(w) && aligned16(g) && (!buf || aligned16(buf));
  const int64_t tail = packed ? n / kRun * kRun : 0;
  for (int64_t k = t; k < tail / kRun; k += stride) sgd_run<kRun>(w, g, buf, k * kRun, r.lr, r.keep, momentum, wb);
  for (int64_t i = tail + t; i < n; i += stride) sgd_run<1>(w, g, buf, i, r.lr, r.keep, momentum, wb);
}

unsigned grid_for(int64_t n) { return static_cast<unsigned>(std::min<int64_t>(ceil_div(n, 256), 8192)); }

}  // namespace

template <class T, class G, class S>
void adam(T* w, const G* g, S* m, S* v, int64_t n, const RuleScalars& r, const WriteBack& wb, ScalarsRef s, cudaStream_t stream) {
  if (n > 0) launch("adam", adam_kernel<T, G, S>, dim3(grid_for(n)), dim3(256), 0, stream, w, g, m, v, n, r, wb, s.at, s.slot);
}
template <class T, class G, class S>
void adam_many(const AdamManyItem* items, int64_t count, int64_t blocks, const RuleScalars& r, const WriteBack& wb, ScalarsRef s,
               cudaStream_t stream) {
  if (count > 0 && blocks > 0)
    launch("adam_many", adam_many_kernel<T, G, S>, dim3(static_cast<unsigned>(blocks)), dim3(256), 0, stream, items, count, r, wb, s.at,
           s.slot);
}

template <class T, class G, class S>
void sgd(T* w, const G* g, S* buf, int64_t n, const RuleScalars& r, float momentum, const WriteBack& wb, ScalarsRef s, cudaStream_t stream) {
  if (n > 0) launch("sgd", sgd_kernel<T, G, S>, dim3(grid_for(n)), dim3(256), 0, stream, w, g, buf, n, r, momentum, wb, s.at, s.slot);
}

// (weights, gradients, states) as the CPU backend instantiates them.
#define MULTINORM_INSTANTIATE(T, G, S)                                                                                 \
  template void adam<T, G, S>(T*, const G*, S*, S*, int64_t, const RuleScalars&, const WriteBack&, ScalarsRef, cudaStream_t); \
  template void sgd<T, G, S>(T*, const G*, S*, int64_t, const RuleScalars&, float, const WriteBack&, ScalarsRef, cudaStream_t); \
  template void adam_many<T, G, S>(const AdamManyItem*, int64_t, int64_t, const RuleScalars&, const WriteBack&, ScalarsRef, cudaStream_t);
MULTINORM_INSTANTIATE(float, float, float)
MULTINORM_INSTANTIATE(float, float, bf16)
MULTINORM_INSTANTIATE(bf16, bf16, float)
MULTINORM_INSTANTIATE(bf16, bf16, bf16)
MULTINORM_INSTANTIATE(bf16, float, float)
MULTINORM_INSTANTIATE(bf16, float, bf16)
#undef MULTINORM_INSTANTIATE

}  // namespace multinorm::cuda
