// SwiGLU on gate_up[N, 2F] = [gate | up] (formulas: kernels/common/op_math.h). Each array has a row
// stride of its own (SwigluStrides: the CUDA plan pads the MLP's rows to 128 bytes where their width
// is off 16 bytes, for the GEMMs). Elementwise; three paths by layout:
//   - F and every stride whole 16-byte packs: a flat grid-stride, one pack per thread;
//   - every stride whole packs, F not (llama_1b's F = 5461 in the plan's padded rows): gate, dout,
//     out and dgate rows start on 16 bytes and move as packs, but the up half starts r = F % P
//     elements past a pack boundary in every row. A block takes a span of one row (256 packs of
//     columns, rows strided over blockIdx.y) and moves the span's up (and dup) as whole aligned
//     packs through shared memory, shifted by r there; element by element go only a row's last,
//     partial pack of each half, and the dup packs a span boundary (or the gate's tail) shares with a
//     neighbour (disjoint elements). The same DRAM bytes as the flat path, 16 bytes a load and a store;
//   - anything else: a (F/256, rows) grid, a thread per element of a row, with no division.
//   forward:  reads 2 N F, writes N F elements of T; ~6 N F FLOPs (sigmoid as one exp)
//   backward: reads 3 N F, writes 2 N F elements of T; ~12 N F FLOPs; with `out` (the forward's
//             output, recomputed for the weight gradient) N F more written and ~2 N F FLOPs, which
//             saves a separate forward (2 N F read, N F written, its sigmoids)
#include "../common/op_math.h"
#include "device_utils.cuh"
#include "kernels.h"

namespace multinorm::cuda {

namespace {

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + __expf(-x)); }

// Element (n, f) for f in [f0, f0 + width): width = a pack (aligned, F a multiple) or 1.
template <class T, int W>
__device__ __forceinline__ void swiglu_forward_span(T* out, const T* gate_up, int64_t n, int64_t f0, int64_t F, const SwigluStrides& ld) {
  const T* g = gate_up + n * ld.gate_up + f0;
  const T* u = g + F;
  T* o = out + n * ld.out + f0;
  if constexpr (W > 1) {
    const Pack<T> gv = *reinterpret_cast<const Pack<T>*>(g), uv = *reinterpret_cast<const Pack<T>*>(u);
    Pack<T> ov;
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const float gf = to_float(gv.v[k]);
      ov.v[k] = from_float<T>(op_math::swiglu(gf, sigmoid(gf), to_float(uv.v[k])));
    }
    *reinterpret_cast<Pack<T>*>(o) = ov;
  } else {
    const float gf = to_float(g[0]);
    o[0] = from_float<T>(op_math::swiglu(gf, sigmoid(gf), to_float(u[0])));
  }
}

// Element (n, f) for f in [f0, f0 + width) of the backward pass; with `out`, the forward too.
template <class T, int W>
__device__ __forceinline__ void swiglu_backward_span(T* dgate_up, T* out, const T* dout, const T* gate_up, int64_t n, int64_t f0, int64_t F,
                                                     const SwigluStrides& ld) {
  const T* g = gate_up + n * ld.gate_up + f0;
  const T* u = g + F;
  const T* d = dout + n * ld.dout + f0;
  T* dg = dgate_up + n * ld.dgate_up + f0;
  T* du = dg + F;
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
    *reinterpret_cast<Pack<T>*>(dg) = dgv;
    *reinterpret_cast<Pack<T>*>(du) = duv;
    if (o) *reinterpret_cast<Pack<T>*>(o) = ov;
  } else {
    const float gf = to_float(g[0]), uf = to_float(u[0]), sig = sigmoid(gf);
    float a, b;
    op_math::swiglu_grad(gf, sig, uf, to_float(d[0]), a, b);
    dg[0] = from_float<T>(a), du[0] = from_float<T>(b);
    if (o) o[0] = from_float<T>(op_math::swiglu(gf, sig, uf));
  }
}

// 16-byte packs: a flat grid-stride over the N F / P packs.
template <class T>
__global__ void swiglu_forward_kernel(T* out, const T* gate_up, int64_t N, int64_t F, SwigluStrides ld) {
  constexpr int W = Pack<T>::kSize;
  const int64_t spans_per_row = F / W, total = N * spans_per_row;
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < total; k += int64_t(gridDim.x) * blockDim.x)
    swiglu_forward_span<T, W>(out, gate_up, k / spans_per_row, (k % spans_per_row) * W, F, ld);
}
template <class T>
__global__ void swiglu_backward_kernel(T* dgate_up, T* out, const T* dout, const T* gate_up, int64_t N, int64_t F, SwigluStrides ld) {
  constexpr int W = Pack<T>::kSize;
  const int64_t spans_per_row = F / W, total = N * spans_per_row;
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < total; k += int64_t(gridDim.x) * blockDim.x)
    swiglu_backward_span<T, W>(dgate_up, out, dout, gate_up, k / spans_per_row, (k % spans_per_row) * W, F, ld);
}

// Any width: blockIdx.x a 256-wide column span, rows strided over blockIdx.y (coalesced, no division).
template <class T>
__global__ void swiglu_forward_rows_kernel(T* out, const T* gate_up, int64_t N, int64_t F, SwigluStrides ld) {
  const int64_t f = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (f >= F) return;
  for (int64_t n = blockIdx.y; n < N; n += gridDim.y) swiglu_forward_span<T, 1>(out, gate_up, n, f, F, ld);
}
template <class T>
__global__ void swiglu_backward_rows_kernel(T* dgate_up, T* out, const T* dout, const T* gate_up, int64_t N, int64_t F, SwigluStrides ld) {
  const int64_t f = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (f >= F) return;
  for (int64_t n = blockIdx.y; n < N; n += gridDim.y) swiglu_backward_span<T, 1>(dgate_up, out, dout, gate_up, n, f, F, ld);
}

// ---- rows of whole-pack strides, F not a whole number of packs ------------------------------------
constexpr int kSpanThreads = 256;  // a block: kSpanThreads packs of one row
constexpr int kWindowBytes = (kSpanThreads + 1) * 16;  // a span's packs and the one its shift reaches

// Up to P values of row + f0 as FP32 (`valid` of them; a whole aligned pack when valid == P).
template <class T>
__device__ __forceinline__ void load_partial(const T* row, int64_t f0, int valid, float (&x)[Pack<T>::kSize]) {
  constexpr int P = Pack<T>::kSize;
  if (valid == P) {
    load_values<T, P>(row, f0, x);
    return;
  }
#pragma unroll
  for (int k = 0; k < P; ++k) x[k] = k < valid ? to_float(row[f0 + k]) : 0.0f;
}
// The first `valid` of P values to row + f0 (a whole aligned pack when valid == P): a row's
// padding is never written.
template <class T>
__device__ __forceinline__ void store_partial(T* row, int64_t f0, int valid, const T (&x)[Pack<T>::kSize]) {
  constexpr int P = Pack<T>::kSize;
  if (valid == P) {
    store_packs<T, P>(row, f0, x);
    return;
  }
#pragma unroll
  for (int k = 0; k < P; ++k)
    if (k < valid) row[f0 + k] = x[k];
}

// Row elements [c0, c_end) through a shared window of kSpanThreads + 1 aligned packs, the window's
// element i being the row's element c0 / P * P + i (so element c of the span sits at c - c0 + c0 % P).
// load_window: every pack holding one of them, whole; the last may reach past c_end (into the next
// span's elements or the row's padding: still the row's, its stride being whole packs).
template <class T>
__device__ __forceinline__ void load_window(T* window, const T* row, int64_t c0, int64_t c_end) {
  constexpr int P = Pack<T>::kSize;
  const int64_t a0 = c0 / P * P;
  for (int p = threadIdx.x; p <= kSpanThreads; p += blockDim.x)
    if (a0 + int64_t(p) * P < c_end) reinterpret_cast<Pack<T>*>(window)[p] = *reinterpret_cast<const Pack<T>*>(row + a0 + int64_t(p) * P);
}
// store_window: the window's elements back to [c0, c_end) of the row, a pack whole where all of it
// lies inside, else element by element (the neighbours' elements are another block's or the padding).
template <class T>
__device__ __forceinline__ void store_window(T* row, const T* window, int64_t c0, int64_t c_end) {
  constexpr int P = Pack<T>::kSize;
  const int64_t a0 = c0 / P * P;
  for (int p = threadIdx.x; p <= kSpanThreads; p += blockDim.x) {
    const int64_t e = a0 + int64_t(p) * P;
    if (e >= c0 && e + P <= c_end) {
      *reinterpret_cast<Pack<T>*>(row + e) = reinterpret_cast<const Pack<T>*>(window)[p];
    } else {
#pragma unroll
      for (int k = 0; k < P; ++k)
        if (e + k >= c0 && e + k < c_end) row[e + k] = window[p * P + k];
    }
  }
}

// A block's span of row columns [span, span + kSpanThreads P) and thread's part of it: columns f0 ..
// f0 + valid - 1, the up half's at F + f0 .., window index `at` (F + span being the window's c0).
struct SpanPart {
  int64_t span, f0, up_end;
  int valid, at;
};
template <class T>
__device__ __forceinline__ SpanPart span_part(int64_t F) {
  constexpr int P = Pack<T>::kSize;
  SpanPart s;
  s.span = int64_t(blockIdx.x) * kSpanThreads * P;
  s.f0 = s.span + int64_t(P) * threadIdx.x;
  s.valid = int(std::max<int64_t>(0, std::min<int64_t>(P, F - s.f0)));
  s.up_end = F + std::min<int64_t>(F, s.span + int64_t(kSpanThreads) * P);
  s.at = int((F + s.span) % P) + P * int(threadIdx.x);
  return s;
}

template <class T>
__global__ void swiglu_forward_shifted_kernel(T* out, const T* gate_up, int64_t N, int64_t F, SwigluStrides ld) {
  constexpr int P = Pack<T>::kSize;
  MN_DYNAMIC_SHARED(T, up);  // kWindowBytes
  const SpanPart s = span_part<T>(F);
  for (int64_t n = blockIdx.y; n < N; n += gridDim.y) {
    const T* g = gate_up + n * ld.gate_up;
    load_window(up, g, F + s.span, s.up_end);
    __syncthreads();
    float gf[P];
    load_partial(g, s.f0, s.valid, gf);
    T o[P];
#pragma unroll
    for (int k = 0; k < P; ++k) o[k] = from_float<T>(op_math::swiglu(gf[k], sigmoid(gf[k]), k < s.valid ? to_float(up[s.at + k]) : 0.0f));
    store_partial(out + n * ld.out, s.f0, s.valid, o);
    __syncthreads();  // the window is refilled for the next row
  }
}

template <class T>
__global__ void
    swiglu_backward_shifted_kernel(T* dgate_up, T* out, const T* dout, const T* gate_up, int64_t N, int64_t F, SwigluStrides ld) {
  constexpr int P = Pack<T>::kSize;
  MN_DYNAMIC_SHARED(T, up);  // 2 kWindowBytes: up's window, then dup's
  T* dup = up + kWindowBytes / sizeof(T);
  const SpanPart s = span_part<T>(F);
  for (int64_t n = blockIdx.y; n < N; n += gridDim.y) {
    const T* g = gate_up + n * ld.gate_up;
    T* dg = dgate_up + n * ld.dgate_up;
    load_window(up, g, F + s.span, s.up_end);
    __syncthreads();
    float gf[P], df[P];
    load_partial(g, s.f0, s.valid, gf);
    load_partial(dout + n * ld.dout, s.f0, s.valid, df);
    T dgv[P], ov[P];
#pragma unroll
    for (int k = 0; k < P; ++k) {
      const float uf = k < s.valid ? to_float(up[s.at + k]) : 0.0f, sig = sigmoid(gf[k]);
      float a, b;
      op_math::swiglu_grad(gf[k], sig, uf, df[k], a, b);
      dgv[k] = from_float<T>(a);
      ov[k] = from_float<T>(op_math::swiglu(gf[k], sig, uf));
      if (k < s.valid) dup[s.at + k] = from_float<T>(b);
    }
    store_partial(dg, s.f0, s.valid, dgv);
    if (out) store_partial(out + n * ld.out, s.f0, s.valid, ov);
    __syncthreads();
    store_window(dg, dup, F + s.span, s.up_end);
    __syncthreads();  // both windows are refilled for the next row
  }
}

// Whether every row of an array starts on 16 bytes: its base aligned, its row stride whole packs
// (each launcher asks it of the arrays its kernel touches).
template <class T>
bool rows_on_packs(const void* p, int64_t stride) {
  return aligned16(p) && stride % Pack<T>::kSize == 0;
}

unsigned grid_for(int64_t work) { return static_cast<unsigned>(std::min<int64_t>(ceil_div(work, 256), 8192)); }
// `spans` column spans x up to 8192 / spans rows at a time (~8192 blocks, as grid_for).
dim3 spans_x_rows(int64_t N, int64_t spans) {
  return dim3(static_cast<unsigned>(spans), static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(N, std::min<int64_t>(65535, 8192 / spans + 1)))));
}
// The rows grid: F/256 column spans.
dim3 rows_grid(int64_t N, int64_t F) { return spans_x_rows(N, ceil_div(F, 256)); }
// The shifted path's grid: spans of kSpanThreads packs.
dim3 spans_grid(int64_t N, int64_t F, int64_t P) { return spans_x_rows(N, ceil_div(F, kSpanThreads * P)); }

}  // namespace

template <class T>
void swiglu_forward(T* out, const T* gate_up, int64_t N, int64_t F, const SwigluStrides& ld, cudaStream_t stream) {
  constexpr int P = Pack<T>::kSize;
  if (N * F == 0) return;
  const bool rows = rows_on_packs<T>(out, ld.out) && rows_on_packs<T>(gate_up, ld.gate_up);
  if (rows && F % P == 0)
    launch("swiglu_forward", swiglu_forward_kernel<T>, dim3(grid_for(N * F / P)), dim3(256), 0, stream, out, gate_up, N, F, ld);
  else if (rows)
    launch("swiglu_forward", swiglu_forward_shifted_kernel<T>, spans_grid(N, F, P), dim3(kSpanThreads), kWindowBytes, stream, out, gate_up, N, F, ld);
  else
    launch("swiglu_forward", swiglu_forward_rows_kernel<T>, rows_grid(N, F), dim3(256), 0, stream, out, gate_up, N, F, ld);
}

template <class T>
void swiglu_backward(T* dgate_up, T* out, const T* dout, const T* gate_up, int64_t N, int64_t F, const SwigluStrides& ld, cudaStream_t stream) {
  constexpr int P = Pack<T>::kSize;
  if (N * F == 0) return;
  const bool rows = rows_on_packs<T>(dgate_up, ld.dgate_up) && rows_on_packs<T>(dout, ld.dout) && rows_on_packs<T>(gate_up, ld.gate_up) &&
                    (!out || rows_on_packs<T>(out, ld.out));
  if (rows && F % P == 0)
    launch("swiglu_backward", swiglu_backward_kernel<T>, dim3(grid_for(N * F / P)), dim3(256), 0, stream, dgate_up, out, dout, gate_up, N, F, ld);
  else if (rows)
    launch("swiglu_backward", swiglu_backward_shifted_kernel<T>, spans_grid(N, F, P), dim3(kSpanThreads), 2 * kWindowBytes, stream, dgate_up, out, dout,
           gate_up, N, F, ld);
  else
    launch("swiglu_backward", swiglu_backward_rows_kernel<T>, rows_grid(N, F), dim3(256), 0, stream, dgate_up, out, dout, gate_up, N, F, ld);
}

template void swiglu_forward<float>(float*, const float*, int64_t, int64_t, const SwigluStrides&, cudaStream_t);
template void swiglu_forward<bf16>(bf16*, const bf16*, int64_t, int64_t, const SwigluStrides&, cudaStream_t);
template void swiglu_backward<float>(float*, float*, const float*, const float*, int64_t, int64_t, const SwigluStrides&, cudaStream_t);
template void swiglu_backward<bf16>(bf16*, bf16*, const bf16*, const bf16*, int64_t, int64_t, const SwigluStrides&, cudaStream_t);

}  // namespace multinorm::cuda
