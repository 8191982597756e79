// SwiGLU on gate_up[N, 2F] = [gate | up] (formulas: kernels/common/op_math.h). Each array has a row
// stride of its own and the up half (and dup) a column of its own (SwigluStrides: in the CUDA plan's
// padded rows, up starts on a 16-byte pack, cuda_scratch::mlp_up_column). Elementwise; two paths
// (which one: cuda_scratch::swiglu_packed, shared with the cost model):
//   - every row and both up halves on 16 bytes (every stride whole packs): a flat grid-stride, one
//     pack of a row per thread, ceil(F / P) packs a row. A row's last pack, where F is not whole
//     packs (llama_1b's 5461), is loaded whole (the row's padding: its stride is whole packs) and
//     stored only in its F % P columns, so a padding is never written;
//   - anything else: a (F/256, rows) grid, a thread per element of a row, with no division.
//   forward:  reads 2 N F, writes N F elements of T; ~6 N F FLOPs (sigmoid as one exp)
//   backward: reads 3 N F, writes 2 N F elements of T; ~12 N F FLOPs; with `out` (the forward's
//             output, recomputed for the weight gradient) N F more written and ~2 N F FLOPs, which
//             saves a separate forward (2 N F read, N F written, its sigmoids)
#include "../common/op_math.h"
#include "device_utils.cuh"
#include "kernels.h"
#include "multinorm/cuda_scratch.h"

namespace multinorm::cuda {

namespace {

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + __expf(-x)); }

// The first `valid` of W values to p (a whole pack when valid == W): a row's padding is never written.
template <class T, int W>
__device__ __forceinline__ void store_first(T* p, const Pack<T>& v, int valid) {
  if (valid == W) {
    *reinterpret_cast<Pack<T>*>(p) = v;
    return;
  }
#pragma unroll
  for (int k = 0; k < W; ++k)
    if (k < valid) p[k] = v.v[k];
}

// Row n's columns f0 .. f0 + valid - 1 of the forward: a pack (W = P; loaded whole, from the row's
// padding past F) or one element (W = 1, valid 1).
template <class T, int W>
__device__ __forceinline__ void swiglu_forward_span(T* out, const T* gate_up, int64_t n, int64_t f0, int valid, const SwigluStrides& ld) {
  const T* g = gate_up + n * ld.gate_up + f0;
  const T* u = gate_up + n * ld.gate_up + ld.up + f0;
  T* o = out + n * ld.out + f0;
  if constexpr (W > 1) {
    const Pack<T> gv = *reinterpret_cast<const Pack<T>*>(g), uv = *reinterpret_cast<const Pack<T>*>(u);
    Pack<T> ov;
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const float gf = to_float(gv.v[k]);
      ov.v[k] = from_float<T>(op_math::swiglu(gf, sigmoid(gf), to_float(uv.v[k])));
    }
    store_first<T, W>(o, ov, valid);
  } else {
    const float gf = to_float(g[0]);
    o[0] = from_float<T>(op_math::swiglu(gf, sigmoid(gf), to_float(u[0])));
  }
}

// The same columns of the backward pass; with `out`, the forward too.
template <class T, int W>
__device__ __forceinline__ void swiglu_backward_span(T* dgate_up, T* out, const T* dout, const T* gate_up, int64_t n, int64_t f0, int valid,
                                                     const SwigluStrides& ld) {
  const T* g = gate_up + n * ld.gate_up + f0;
  const T* u = gate_up + n * ld.gate_up + ld.up + f0;
  const T* d = dout + n * ld.dout + f0;
  T* dg = dgate_up + n * ld.dgate_up + f0;
  T* du = dgate_up + n * ld.dgate_up + ld.dup + f0;
  T* o = out ? out + n * ld.out + f0 : nullptr;
  if constexpr (W > 1) {
    const Pack<T> gv = *reinterpret_cast<const Pack<T>*>(g), uv = *reinterpret_cast<const Pack<T>*>(u), dv = *reinterpret_cast<const Pack<T>*>(d);
    Pack<T> dgv, duv, ov;
#pragma unroll
    for (int j = 0; j < W; ++j) {
      const float gf = to_float(gv.v[j]), uf = to_float(uv.v[j]), sig = sigmoid(gf);
      float a, b;
      op_math::swiglu_grad(gf, sig, uf, to_float(dv.v[j]), a, b);
      dgv.v[j] = from_float<T>(a), duv.v[j] = from_float<T>(b);
      ov.v[j] = from_float<T>(op_math::swiglu(gf, sig, uf));
    }
    store_first<T, W>(dg, dgv, valid);
    store_first<T, W>(du, duv, valid);
    if (o) store_first<T, W>(o, ov, valid);
  } else {
    const float gf = to_float(g[0]), uf = to_float(u[0]), sig = sigmoid(gf);
    float a, b;
    op_math::swiglu_grad(gf, sig, uf, to_float(d[0]), a, b);
    dg[0] = from_float<T>(a), du[0] = from_float<T>(b);
    if (o) o[0] = from_float<T>(op_math::swiglu(gf, sig, uf));
  }
}

// 16-byte packs: a flat grid-stride over the N ceil(F / P) packs, a row's last one partial where F
// is not whole packs.
template <class T>
__global__ void swiglu_forward_kernel(T* out, const T* gate_up, int64_t N, int64_t F, SwigluStrides ld) {
  constexpr int W = Pack<T>::kSize;
  const int64_t spans_per_row = (F + W - 1) / W, total = N * spans_per_row;
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < total; k += int64_t(gridDim.x) * blockDim.x) {
    const int64_t f0 = (k % spans_per_row) * W;
    swiglu_forward_span<T, W>(out, gate_up, k / spans_per_row, f0, int(F - f0 < W ? F - f0 : W), ld);
  }
}
template <class T>
__global__ void swiglu_backward_kernel(T* dgate_up, T* out, const T* dout, const T* gate_up, int64_t N, int64_t F, SwigluStrides ld) {
  constexpr int W = Pack<T>::kSize;
  const int64_t spans_per_row = (F + W - 1) / W, total = N * spans_per_row;
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < total; k += int64_t(gridDim.x) * blockDim.x) {
    const int64_t f0 = (k % spans_per_row) * W;
    swiglu_backward_span<T, W>(dgate_up, out, dout, gate_up, k / spans_per_row, f0, int(F - f0 < W ? F - f0 : W), ld);
  }
}

// Any layout: blockIdx.x a 256-wide column span, rows strided over blockIdx.y (coalesced, no division).
template <class T>
__global__ void swiglu_forward_rows_kernel(T* out, const T* gate_up, int64_t N, int64_t F, SwigluStrides ld) {
  const int64_t f = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (f >= F) return;
  for (int64_t n = blockIdx.y; n < N; n += gridDim.y) swiglu_forward_span<T, 1>(out, gate_up, n, f, 1, ld);
}
template <class T>
__global__ void swiglu_backward_rows_kernel(T* dgate_up, T* out, const T* dout, const T* gate_up, int64_t N, int64_t F, SwigluStrides ld) {
  const int64_t f = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (f >= F) return;
  for (int64_t n = blockIdx.y; n < N; n += gridDim.y) swiglu_backward_span<T, 1>(dgate_up, out, dout, gate_up, n, f, 1, ld);
}

uintptr_t address(const void* p) { return reinterpret_cast<uintptr_t>(p); }

unsigned grid_for(int64_t work) { return static_cast<unsigned>(std::min<int64_t>(ceil_div(work, 256), 8192)); }
// The rows grid: F/256 column spans x up to 8192 / spans rows at a time (~8192 blocks, as grid_for).
dim3 rows_grid(int64_t N, int64_t F) {
  const int64_t spans = ceil_div(F, 256);
  return dim3(static_cast<unsigned>(spans), static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(N, std::min<int64_t>(65535, 8192 / spans + 1)))));
}

}  // namespace

template <class T>
void swiglu_forward(T* out, const T* gate_up, int64_t N, int64_t F, const SwigluStrides& ld, cudaStream_t stream) {
  if (N * F == 0) return;
  const bool packs = cuda_scratch::swiglu_packed(
      F, sizeof(T), {{address(out), ld.out, 0}, {address(gate_up), ld.gate_up, 0}, {address(gate_up), ld.gate_up, ld.up}});
  if (packs)
    launch("swiglu_forward", swiglu_forward_kernel<T>, dim3(grid_for(N * ceil_div(F, Pack<T>::kSize))), dim3(256), 0, stream, out, gate_up, N, F,
           ld);
  else
    launch("swiglu_forward_elementwise", swiglu_forward_rows_kernel<T>, rows_grid(N, F), dim3(256), 0, stream, out, gate_up, N, F, ld);
}

template <class T>
void swiglu_backward(T* dgate_up, T* out, const T* dout, const T* gate_up, int64_t N, int64_t F, const SwigluStrides& ld, cudaStream_t stream) {
  if (N * F == 0) return;
  const bool packs = cuda_scratch::swiglu_packed(F, sizeof(T),
                                                 {{address(dgate_up), ld.dgate_up, 0}, {address(dgate_up), ld.dgate_up, ld.dup},
                                                  {address(dout), ld.dout, 0}, {address(gate_up), ld.gate_up, 0}, {address(gate_up), ld.gate_up, ld.up},
                                                  {address(out ? out : dout), out ? ld.out : ld.dout, 0}});  // (no out: dout again)
  if (packs)
    launch("swiglu_backward", swiglu_backward_kernel<T>, dim3(grid_for(N * ceil_div(F, Pack<T>::kSize))), dim3(256), 0, stream, dgate_up, out, dout,
           gate_up, N, F, ld);
  else
    launch("swiglu_backward_elementwise", swiglu_backward_rows_kernel<T>, rows_grid(N, F), dim3(256), 0, stream, dgate_up, out, dout, gate_up, N, F,
           ld);
}

template void swiglu_forward<float>(float*, const float*, int64_t, int64_t, const SwigluStrides&, cudaStream_t);
template void swiglu_forward<bf16>(bf16*, const bf16*, int64_t, int64_t, const SwigluStrides&, cudaStream_t);
template void swiglu_backward<float>(float*, float*, const float*, const float*, int64_t, int64_t, const SwigluStrides&, cudaStream_t);
template void swiglu_backward<bf16>(bf16*, bf16*, const bf16*, const bf16*, int64_t, int64_t, const SwigluStrides&, cudaStream_t);

}  // namespace multinorm::cuda
