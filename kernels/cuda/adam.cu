// The elementwise optimizers, one pass each (Adam's per-element step and scalars:
// kernels/common/optim_math.h, shared with the CPU; the same write-back rounding). With an
// UpdateScalars (device memory) the scalars come from its slot when the kernel runs, and a skipped
// update writes nothing (take_update_scalars): one more 64-byte read per block, from L2.
//   Adam: reads w, g, m, v and writes w, m, v: per element sizeof(T) * 2 + sizeof(G) + 4 sizeof(S)
//         bytes (BF16 everything: 12 B), ~15 FLOPs
//   SGD:  reads w, g (+ buf) and writes w (+ buf): 2 sizeof(T) + sizeof(G) [+ 2 sizeof(S)] bytes
#include "device_utils.cuh"
#include "kernels.h"

namespace multinorm::cuda {

namespace {

template <class T, class G, class S>
__global__ void adam_kernel(T* w, const G* g, S* m, S* v, int64_t n, RuleScalars r, WriteBack wb, const UpdateScalars* s, int slot) {
  if (!take_update_scalars(s, slot, r, wb)) return;
  const AdamScalars& a = r.adam;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float mi = to_float(m[i]), vi = to_float(v[i]);
    const float wi = optim_math::adam_element(to_float(w[i]), to_float(g[i]), mi, vi, a);
    m[i] = from_float<S>(mi);
    v[i] = from_float<S>(vi);
    w[i] = store_weight<T>(wi, wb, static_cast<uint64_t>(i));
  }
}

// One launch over many tensors: block b serves the item whose block range holds b (a short scan of
// at most kAdamManyPerLaunch items, L2-resident), kAdamManyElementsPerBlock elements each.
template <class T, class G, class S>
__global__ void adam_many_kernel(const AdamManyItem* items, int64_t count, RuleScalars r, WriteBack wb, const UpdateScalars* s, int slot) {
  if (!take_update_scalars(s, slot, r, wb)) return;
  const AdamScalars& a = r.adam;
  int64_t i = 0;
  while (i + 1 < count && items[i + 1].first_block <= int64_t(blockIdx.x)) ++i;
  const AdamManyItem it = items[i];
  T* w = static_cast<T*>(it.w);
  const G* g = static_cast<const G*>(it.g);
  S* m = static_cast<S*>(it.m);
  S* v = static_cast<S*>(it.v);
  wb.tensor = it.tensor;
  const int64_t begin = (int64_t(blockIdx.x) - it.first_block) * kAdamManyElementsPerBlock;
  const int64_t end = begin + kAdamManyElementsPerBlock < it.n ? begin + kAdamManyElementsPerBlock : it.n;
  for (int64_t e = begin + threadIdx.x; e < end; e += blockDim.x) {
    float mi = to_float(m[e]), vi = to_float(v[e]);
    const float wi = optim_math::adam_element(to_float(w[e]), to_float(g[e]), mi, vi, a);
    m[e] = from_float<S>(mi);
    v[e] = from_float<S>(vi);
    w[e] = store_weight<T>(wi, wb, static_cast<uint64_t>(e));
  }
}

template <class T, class G, class S>
__global__ void sgd_kernel(T* w, const G* g, S* buf, int64_t n, RuleScalars r, float momentum, WriteBack wb, const UpdateScalars* s, int slot) {
  if (!take_update_scalars(s, slot, r, wb)) return;
  const float lr = r.lr, keep = r.keep;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float d = to_float(g[i]);
    if (buf) {
      d = momentum * to_float(buf[i]) + d;
      buf[i] = from_float<S>(d);
    }
    w[i] = store_weight<T>(to_float(w[i]) * keep - lr * d, wb, static_cast<uint64_t>(i));
  }
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
