// RMSNorm over rows of width C (the shared formula: kernels/common/op_math.h).
//   forward:  one warp per row (4 rows per 128-thread block), FP32 sum of squares by warp shuffles,
//             16-byte packs when the row allows. bytes: 2 N C sizeof(T) + C sizeof(T) + 4N; 4 N C FLOPs
//   backward: dx (FP32, = or +=, the residual-stream gradient fused in) and dw (+=), deterministic.
//             Rows: a fixed grid of at most kBackwardBlocks blocks of 8 warps, each owning a
//             contiguous chunk of rows, taken 8 at a time: a warp per row forms mean(dout w xhat)
//             with shuffles only and writes dx (two passes over the row, the second from L1/L2); then
//             each thread adds the 8 rows' dout xhat to the channels it owns (8 consecutive ones as
//             16-byte packs) in the block's shared dw partial. The same thread zeroes, adds and writes out its
//             channels, so the kernel has no barrier at all. Then dw: (C/32) blocks of 32 channels x
//             8 partial groups, each group summing every 8th block's partial in block order, the 8
//             group sums added in order. bytes: N C (4 + 4 + sizeof(T)) (dout, dx, x) [+ 4 N C when
//             accumulating] + partials 2 P C 4; ~8 N C FLOPs. Rows up to kSharedOptInFloats wide.
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

constexpr int kBackwardWarps = kBackwardThreads / 32;  // rows taken at a time by a block
constexpr int kDwGroups = 8;                             // partial groups of the dw reduction

// dx of one row by one warp: mean = sum(dout w xhat) / C, then dx = rstd (dout w - xhat mean), and
// its copy rounded to T where asked. P = 8: runs of 8 channels as 16-byte packs (dout, dx: two; x, w,
// the copy: one in BF16, two in FP32).
template <class T, int P>
__device__ void rmsnorm_dx_row(float* dx, T* dx_copy, const float* d, const T* x, const T* w, float r, int64_t C, bool accumulate, int lane) {
  float dot = 0.0f;
  for (int64_t c = int64_t(P) * lane; c < C; c += 32 * P) {
    float dv[P], xv[P], wv[P];
    load_values<float, P>(d, c, dv), load_values<T, P>(x, c, xv), load_values<T, P>(w, c, wv);
#pragma unroll
    for (int k = 0; k < P; ++k) dot += dv[k] * wv[k] * (xv[k] * r);
  }
  const float mean = warp_sum(dot) / float(C);
  for (int64_t c = int64_t(P) * lane; c < C; c += 32 * P) {
    float dv[P], xv[P], wv[P], out[P];
    load_values<float, P>(d, c, dv), load_values<T, P>(x, c, xv), load_values<T, P>(w, c, wv);
    if (accumulate) load_values<float, P>(dx, c, out);
#pragma unroll
    for (int k = 0; k < P; ++k) {
      const float v = op_math::rmsnorm_dx(dv[k], wv[k], xv[k] * r, r, mean);
      out[k] = accumulate ? out[k] + v : v;
    }
    store_packs<float, P>(dx, c, out);
    if (dx_copy) {
      T rounded[P];
#pragma unroll
      for (int k = 0; k < P; ++k) rounded[k] = from_float<T>(out[k]);
      store_packs<T, P>(dx_copy, c, rounded);
    }
  }
}

// The block's rows begin..end-1: dx a warp per row, and dout xhat into the thread-owned channels of
// the shared dw partial (P consecutive channels a thread and step).
template <class T, int P>
__device__ void rmsnorm_backward_rows(float* dx, T* dx_copy, float* dw_local, const float* dout, const T* x, const T* w, const float* rstd,
                                      int64_t begin, int64_t end, int64_t C, bool accumulate_dx) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const float zeros[P] = {};
  for (int64_t c = int64_t(P) * threadIdx.x; c < C; c += int64_t(P) * blockDim.x) store_packs<float, P>(dw_local, c, zeros);
  for (int64_t g = begin; g < end; g += kBackwardWarps) {
    const int64_t i = g + warp;
    if (i < end) rmsnorm_dx_row<T, P>(dx + i * C, dx_copy ? dx_copy + i * C : nullptr, dout + i * C, x + i * C, w, rstd[i], C, accumulate_dx, lane);
    const int64_t last = g + kBackwardWarps < end ? g + kBackwardWarps : end;
    for (int64_t c = int64_t(P) * threadIdx.x; c < C; c += int64_t(P) * blockDim.x) {
      float acc[P];
      load_values<float, P>(dw_local, c, acc);
      for (int64_t r = g; r < last; ++r) {  // rows in order: the partial's sum is deterministic
        const float rr = rstd[r];
        float dv[P], xv[P];
        load_values<float, P>(dout + r * C, c, dv), load_values<T, P>(x + r * C, c, xv);
#pragma unroll
        for (int k = 0; k < P; ++k) acc[k] += dv[k] * (xv[k] * rr);
      }
      store_packs<float, P>(dw_local, c, acc);
    }
  }
}

// Block b handles rows [b * rows_per_block, ...); dynamic shared memory: C floats of dw partial,
// each channel touched by one thread only (no barrier, no atomics).
template <class T>
__global__ void rmsnorm_backward_rows_kernel(float* dx, T* dx_copy, float* partials, const float* dout, const T* x, const T* w, const float* rstd,
                                             int64_t N, int64_t C, int64_t rows_per_block, bool accumulate_dx, bool packed) {
  MN_DYNAMIC_SHARED(float, dw_local);
  const int64_t begin = int64_t(blockIdx.x) * rows_per_block, end = begin + rows_per_block < N ? begin + rows_per_block : N;
  if (packed)
    rmsnorm_backward_rows<T, 8>(dx, dx_copy, dw_local, dout, x, w, rstd, begin, end, C, accumulate_dx);
  else
    rmsnorm_backward_rows<T, 1>(dx, dx_copy, dw_local, dout, x, w, rstd, begin, end, C, accumulate_dx);
  const int P = packed ? 8 : 1;  // the channel ownership of the loops above
  for (int64_t c = int64_t(P) * threadIdx.x; c < C; c += int64_t(P) * blockDim.x)
    for (int k = 0; k < P; ++k) partials[int64_t(blockIdx.x) * C + c + k] = dw_local[c + k];
}

// dw += the blocks' partials: 32 channels a block; group q sums blocks q, q + 8, ... in order, then
// the 8 group sums are added in group order (the same tree on every GPU).
template <class G>
__global__ void rmsnorm_backward_dw_kernel(G* dw, const float* partials, int64_t blocks, int64_t C) {
  __shared__ float group_sum[kDwGroups][32];
  const int lane = threadIdx.x % 32, q = threadIdx.x / 32;
  const int64_t c = int64_t(blockIdx.x) * 32 + lane;
  float s = 0.0f;
  if (c < C)
    for (int64_t b = q; b < blocks; b += kDwGroups) s += partials[b * C + c];
  group_sum[q][lane] = s;
  __syncthreads();
  if (q != 0 || c >= C) return;
  float total = 0.0f;
  for (int g = 0; g < kDwGroups; ++g) total += group_sum[g][lane];
  dw[c] = from_float<G>(to_float(dw[c]) + total);
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
void rmsnorm_backward(float* dx, T* dx_copy, G* dw, const float* dout, const T* x, const T* w, const float* rstd, int64_t N, int64_t C,
                      bool accumulate_dx, float* scratch, cudaStream_t stream) {
  if (N == 0) return;
  const int64_t rows_per_block = (N + kBackwardBlocks - 1) / kBackwardBlocks;
  const int64_t blocks = (N + rows_per_block - 1) / rows_per_block;
  // 8 channels a thread where every row starts on 16 bytes: C a multiple of 8 and the bases aligned.
  const bool packed = C % 8 == 0 && aligned16(dx) && aligned16(dout) && aligned16(x) && aligned16(w) && (!dx_copy || aligned16(dx_copy));
  launch("rmsnorm_backward_rows", rmsnorm_backward_rows_kernel<T>, dim3(static_cast<unsigned>(blocks)), dim3(kBackwardThreads), C * sizeof(float),
         stream, dx, dx_copy, scratch, dout, x, w, rstd, N, C, rows_per_block, accumulate_dx, packed);
  launch("rmsnorm_backward_dw", rmsnorm_backward_dw_kernel<G>, dim3(ceil_div(C, 32)), dim3(32 * kDwGroups), 0, stream, dw, scratch, blocks, C);
}

template void rmsnorm_forward<float>(float*, float*, const float*, const float*, int64_t, int64_t, float, cudaStream_t);
template void rmsnorm_forward<bf16>(bf16*, float*, const bf16*, const bf16*, int64_t, int64_t, float, cudaStream_t);
template void rmsnorm_backward<float, float>(float*, float*, float*, const float*, const float*, const float*, const float*, int64_t, int64_t, bool, float*,
                                             cudaStream_t);
template void rmsnorm_backward<bf16, bf16>(float*, bf16*, bf16*, const float*, const bf16*, const bf16*, const float*, int64_t, int64_t, bool, float*,
                                           cudaStream_t);
template void rmsnorm_backward<bf16, float>(float*, bf16*, float*, const float*, const bf16*, const bf16*, const float*, int64_t, int64_t, bool, float*,
                                            cudaStream_t);

}  // namespace multinorm::cuda
