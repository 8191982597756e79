// RMSNorm over rows of width C (the shared formula: kernels/common/op_math.h).
//   forward:  one warp per row (4 rows per 128-thread block), FP32 sum of squares by warp shuffles,
//             16-byte packs when the row allows. bytes: 2 N C sizeof(T) + C sizeof(T) + 4N; 4 N C FLOPs
//   backward: dx (FP32, = or +=, the residual-stream gradient fused in) and dw (+=), deterministic:
//             a fixed grid of at most kBackwardBlocks blocks, each owning a contiguous chunk of rows,
//             accumulates dw for its rows in shared memory (each thread owns the channels c = tid mod
//             blockDim: no races, no atomics); a second kernel sums the per-block partials in block
//             order. bytes: N C (4 + 4 + sizeof(T)) (dout, dx, x) [+ 4 N C when accumulating] +
//             partials 2 P C 4; ~8 N C FLOPs
#include "../common/op_math.h"
#include "device_utils.cuh"
#include "kernels.h"
#include "multinorm/cuda_scratch.h"

namespace multinorm::cuda {

namespace {

constexpr int kForwardWarps = 4;
constexpr int kBackwardThreads = 256;
constexpr int64_t kBackwardBlocks = cuda_scratch::kRmsnormBackwardBlocks;  // fixed: the same reduction tree everywhere

template <class T>
__global__ void rmsnorm_forward_kernel(T* out, float* rstd, const T* x, const T* w, int64_t N, int64_t C, float eps) {
  const int lane = threadIdx.x % 32;
  const int64_t row = int64_t(blockIdx.x) * kForwardWarps + threadIdx.x / 32;
  if (row >= N) return;  // whole warps leave together: no barrier below, only warp shuffles
  const T* xr = x + row * C;
  T* yr = out + row * C;
  float ss = 0.0f;
  const bool packed = packable<T>(xr, C) && packable<T>(yr, C) && packable<T>(w, C);
  constexpr int P = Pack<T>::kSize;
  if (packed) {
    for (int64_t p = lane; p < C / P; p += 32) {
      const Pack<T> v = reinterpret_cast<const Pack<T>*>(xr)[p];
#pragma unroll
      for (int k = 0; k < P; ++k) ss += to_float(v.v[k]) * to_float(v.v[k]);
    }
  } else {
    for (int64_t c = lane; c < C; c += 32) ss += to_float(xr[c]) * to_float(xr[c]);
  }
  ss = warp_sum(ss);
  const float r = op_math::rmsnorm_rstd(ss, rsqrtf(ss / float(C) + eps));
  if (lane == 0) rstd[row] = r;
  if (packed) {
    for (int64_t p = lane; p < C / P; p += 32) {
      const Pack<T> v = reinterpret_cast<const Pack<T>*>(xr)[p];
      const Pack<T> wv = reinterpret_cast<const Pack<T>*>(w)[p];
      Pack<T> o;
#pragma unroll
      for (int k = 0; k < P; ++k) o.v[k] = from_float<T>(to_float(v.v[k]) * r * to_float(wv.v[k]));
      reinterpret_cast<Pack<T>*>(yr)[p] = o;
    }
  } else {
    for (int64_t c = lane; c < C; c += 32) yr[c] = from_float<T>(to_float(xr[c]) * r * to_float(w[c]));
  }
}

// Block b handles rows [b * rows_per_block, ...); dynamic shared memory: C floats of dw partial.
template <class T>
__global__ void rmsnorm_backward_rows_kernel(float* dx, float* partials, const float* dout, const T* x, const T* w, const float* rstd,
                                             int64_t N, int64_t C, int64_t rows_per_block, bool accumulate_dx) {
  MN_DYNAMIC_SHARED(float, dw_local);
  __shared__ float scratch[32];
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) dw_local[c] = 0.0f;
  const int64_t begin = int64_t(blockIdx.x) * rows_per_block, end = begin + rows_per_block < N ? begin + rows_per_block : N;
  for (int64_t i = begin; i < end; ++i) {
    const T* xi = x + i * C;
    const float* di = dout + i * C;
    const float r = rstd[i];
    float dot = 0.0f;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      const float xh = to_float(xi[c]) * r, d = di[c];
      dot += d * to_float(w[c]) * xh;
      dw_local[c] += d * xh;  // thread-owned channel: no race
    }
    const float mean = block_sum(dot, scratch) / float(C);
    float* dxi = dx + i * C;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      const float v = op_math::rmsnorm_dx(di[c], to_float(w[c]), to_float(xi[c]) * r, r, mean);
      dxi[c] = accumulate_dx ? dxi[c] + v : v;
    }
  }
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) partials[int64_t(blockIdx.x) * C + c] = dw_local[c];
}

template <class G>
__global__ void rmsnorm_backward_dw_kernel(G* dw, const float* partials, int64_t blocks, int64_t C) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float s = 0.0f;
  for (int64_t b = 0; b < blocks; ++b) s += partials[b * C + c];  // fixed order: deterministic
  dw[c] = from_float<G>(to_float(dw[c]) + s);
}

}  // namespace

template <class T>
void rmsnorm_forward(T* out, float* rstd, const T* x, const T* w, int64_t N, int64_t C, float eps, cudaStream_t stream) {
  if (N > 0)
    launch("rmsnorm_forward", rmsnorm_forward_kernel<T>, dim3(ceil_div(N, kForwardWarps)), dim3(32 * kForwardWarps), 0, stream, out, rstd, x, w,
           N, C, eps);
}

int64_t rmsnorm_backward_scratch(int64_t N, int64_t C) { return cuda_scratch::rmsnorm_backward_floats(N, C); }

template <class T, class G>
void rmsnorm_backward(float* dx, G* dw, const float* dout, const T* x, const T* w, const float* rstd, int64_t N, int64_t C, bool accumulate_dx,
                      float* scratch, cudaStream_t stream) {
  if (N == 0) return;
  const int64_t rows_per_block = (N + kBackwardBlocks - 1) / kBackwardBlocks;
  const int64_t blocks = (N + rows_per_block - 1) / rows_per_block;
  launch("rmsnorm_backward_rows", rmsnorm_backward_rows_kernel<T>, dim3(static_cast<unsigned>(blocks)), dim3(kBackwardThreads), C * sizeof(float),
         stream, dx, scratch, dout, x, w, rstd, N, C, rows_per_block, accumulate_dx);
  launch("rmsnorm_backward_dw", rmsnorm_backward_dw_kernel<G>, dim3(ceil_div(C, 256)), dim3(256), 0, stream, dw, scratch, blocks, C);
}

template void rmsnorm_forward<float>(float*, float*, const float*, const float*, int64_t, int64_t, float, cudaStream_t);
template void rmsnorm_forward<bf16>(bf16*, float*, const bf16*, const bf16*, int64_t, int64_t, float, cudaStream_t);
template void rmsnorm_backward<float, float>(float*, float*, const float*, const float*, const float*, const float*, int64_t, int64_t, bool, float*,
                                             cudaStream_t);
template void rmsnorm_backward<bf16, bf16>(float*, bf16*, const float*, const bf16*, const bf16*, const float*, int64_t, int64_t, bool, float*,
                                           cudaStream_t);
template void rmsnorm_backward<bf16, float>(float*, float*, const float*, const bf16*, const bf16*, const float*, int64_t, int64_t, bool, float*,
                                            cudaStream_t);

}  // namespace multinorm::cuda
