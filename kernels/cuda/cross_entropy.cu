// Softmax cross-entropy over rows of FP32 logits[N, V] fused with its gradient and the loss mask:
// one block per row; pass 1 keeps an online (max, sum of exp) per thread, merged by warp shuffles and
// then across warps; pass 2 writes dlogits = (softmax - onehot) * grad_scale directly (probabilities
// are never stored; dlogits may alias logits: each element is read then written by one thread).
// bytes: N V 4 read twice (the second pass mostly from L2 for V = 32000 rows of 128 KB) + N V
// sizeof(T) written; ~5 N V FLOPs. accumulate_loss: one block reads the N losses and the mask (5 N
// bytes) and adds their FP64 sum, count and mean to the update's totals.
#include "../common/optim_math.h"
#include "device_utils.cuh"
#include "kernels.h"

namespace multinorm::cuda {

namespace {

constexpr int kThreads = 512;

// Merge two (max, sum of exp(x - max)) pairs.
__device__ __forceinline__ void merge(float& m, float& s, float m2, float s2) {
  const float mn = fmaxf(m, m2);
  if (mn == -INFINITY) return;  // both empty
  s = s * __expf(m - mn) + s2 * __expf(m2 - mn);
  m = mn;
}

template <class T>
__global__ void cross_entropy_kernel(float* losses, T* dlogits, const float* logits, const int32_t* targets, const uint8_t* mask, int64_t V,
                                     float grad_scale) {
  __shared__ float warp_m[32], warp_s[32];
  const int64_t row = blockIdx.x;
  const float* x = logits + row * V;
  T* d = dlogits ? dlogits + row * V : nullptr;
  if (mask && !mask[row]) {  // the whole block takes this branch: no barrier is skipped by some threads only
    if (threadIdx.x == 0) losses[row] = 0.0f;
    if (d)
      for (int64_t v = threadIdx.x; v < V; v += blockDim.x) d[v] = from_float<T>(0.0f);
    return;
  }
  float m = -INFINITY, s = 0.0f;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    const float xv = x[v];
    if (xv > m) {
      s = s * __expf(m - xv) + 1.0f;
      m = xv;
    } else if (xv != -INFINITY) {  // a -inf logit adds nothing (and -inf - -inf would be NaN)
      s += __expf(xv - m);
    }
  }
  for (int o = 16; o > 0; o >>= 1) merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_m[warp] = m, warp_s[warp] = s;
  __syncthreads();
  m = lane < int(blockDim.x / 32) ? warp_m[lane] : -INFINITY;
  s = lane < int(blockDim.x / 32) ? warp_s[lane] : 0.0f;
  for (int o = 16; o > 0; o >>= 1) merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
  // The two lanes of a butterfly pair merge in opposite orders, which FMA contraction may round
  // differently: every thread takes lane 0's (m, s), so one lse serves the whole row.
  m = __shfl_sync(0xffffffffu, m, 0);
  s = __shfl_sync(0xffffffffu, s, 0);
  const float lse = m + logf(s);
  const int32_t t = targets[row];
  const float xt = x[t];
  __syncthreads();  // every thread has read x[t] before the row is overwritten (aliasing)
  if (threadIdx.x == 0) losses[row] = lse - xt;
  if (d) {
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
      const float p = __expf(x[v] - lse);
      d[v] = from_float<T>((v == t ? p - 1.0f : p) * grad_scale);
    }
  }
}

// One block of kLossLanes threads: lane j adds positions j, j + kLossLanes, ... (FP64, in order),
// thread 0 adds the lanes in lane order: optim_math's order, the CPU's bits.
__global__ void accumulate_loss_kernel(LossTotals* totals, const float* losses, const uint8_t* mask, int64_t n) {
  __shared__ double lane_sums[optim_math::kLossLanes];
  __shared__ int64_t lane_counts[optim_math::kLossLanes];
  double s = 0;
  int64_t c = 0;
  for (int64_t i = threadIdx.x; i < n; i += optim_math::kLossLanes)
    if (mask[i]) s += losses[i], ++c;
  lane_sums[threadIdx.x] = s;
  lane_counts[threadIdx.x] = c;
  __syncthreads();
  if (threadIdx.x != 0) return;
  double sum = 0;
  int64_t count = 0;
  for (int j = 0; j < optim_math::kLossLanes; ++j) sum += lane_sums[j], count += lane_counts[j];
  optim_math::add_micro_batch_loss(*totals, sum, count);
}

}  // namespace

void accumulate_loss(LossTotals* totals, const float* losses, const uint8_t* mask, int64_t N, cudaStream_t stream) {
  launch("accumulate_loss", accumulate_loss_kernel, dim3(1), dim3(optim_math::kLossLanes), 0, stream, totals, losses, mask, N);
}

template <class T>
void cross_entropy(float* losses, T* dlogits, const float* logits, const int32_t* targets, const uint8_t* mask, int64_t N, int64_t V,
                   float grad_scale, cudaStream_t stream) {
  if (N > 0)
    launch("cross_entropy", cross_entropy_kernel<T>, dim3(static_cast<unsigned>(N)), dim3(kThreads), 0, stream, losses, dlogits, logits, targets,
           mask, V, grad_scale);
}

template void cross_entropy<float>(float*, float*, const float*, const int32_t*, const uint8_t*, int64_t, int64_t, float, cudaStream_t);
template void cross_entropy<bf16>(float*, bf16*, const float*, const int32_t*, const uint8_t*, int64_t, int64_t, float, cudaStream_t);

}  // namespace multinorm::cuda
