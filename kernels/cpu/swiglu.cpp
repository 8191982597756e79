// SwiGLU: out = silu(g) * u with gate_up[N, 2F] = [g | u], silu(g) = g * sigmoid(g).
// Backward: dg = dout * u * sigmoid(g) * (1 + g * (1 - sigmoid(g))),  du = dout * silu(g); optionally
// the forward's output as well (the model's backward recomputes it rather than storing it). Each is
// also fused with the GEMM before it (the packed GEMM): gate_up = x Wgu^T and ds = dy Wdown.
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "../common/fast_math.h"
#include "../common/op_math.h"
#include "bf16_rows.h"
#include "cpu_kernels.h"
#include "matmul_packed.h"

namespace multinorm::cpu {

namespace {
// Outputs are formed in FP32 blocks of kBlock (on the stack, in L1) and stored by store_row (a BF16
// row rounded 32 values per instruction).
constexpr int64_t kBlock = 256;

// One row: out[F] = swiglu(gate_up[2F]).
template <class T>
void swiglu_forward_row(T* o, const T* gate_up, int64_t F) {
  const T* g = gate_up;
  const T* u = g + F;
  for (int64_t f0 = 0; f0 < F; f0 += kBlock) {
    const int64_t n = std::min(kBlock, F - f0);
    alignas(64) float ob[kBlock];
#pragma omp simd
    for (int64_t f = 0; f < n; ++f) {
      const float gv = to_f32(g[f0 + f]);
      ob[f] = op_math::swiglu(gv, sigmoid_f32(gv), to_f32(u[f0 + f]));
    }
    store_row(ob, o + f0, n);
  }
}

// One row of the backward: dgate_up[2F] from dout[F] and gate_up[2F]; with kOut, the forward's output
// out[F] too (the same expression as swiglu_forward_row: the same bits), for a backward that
// recomputes it: gate_up is read and the sigmoid evaluated once for both.
template <class T, bool kOut>
void swiglu_backward_row(T* dgate_up, T* o, const T* d, const T* gate_up, int64_t F) {
  const T* g = gate_up;
  const T* u = g + F;
  T* dg = dgate_up;
  T* du = dg + F;
  for (int64_t f0 = 0; f0 < F; f0 += kBlock) {
    const int64_t n = std::min(kBlock, F - f0);
    alignas(64) float ab[kBlock], bb[kBlock], ob[kBlock];
#pragma omp simd
    for (int64_t f = 0; f < n; ++f) {
      const float gv = to_f32(g[f0 + f]), uv = to_f32(u[f0 + f]), dv = to_f32(d[f0 + f]), sig = sigmoid_f32(gv);
      op_math::swiglu_grad(gv, sig, uv, dv, ab[f], bb[f]);
      if constexpr (kOut) ob[f] = op_math::swiglu(gv, sig, uv);
    }
    store_row(ab, dg + f0, n);
    store_row(bb, du + f0, n);
    if constexpr (kOut) store_row(ob, o + f0, n);
  }
}

template <class T, bool kOut>
void swiglu_backward_rows(T* dgate_up, T* out, const T* dout, const T* gate_up, int64_t N, int64_t F) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i)
    swiglu_backward_row<T, kOut>(dgate_up + i * 2 * F, kOut ? out + i * F : nullptr, dout + i * F, gate_up + i * 2 * F, F);
}

}  // namespace

template <class T>
void swiglu_forward(T* out, const T* gate_up, int64_t N, int64_t F) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) swiglu_forward_row(out + i * F, gate_up + i * 2 * F, F);
}

template <class T>
void swiglu_backward(T* dgate_up, T* out, const T* dout, const T* gate_up, int64_t N, int64_t F) {
  if (out)
    swiglu_backward_rows<T, true>(dgate_up, out, dout, gate_up, N, F);
  else
    swiglu_backward_rows<T, false>(dgate_up, out, dout, gate_up, N, F);
}

// The fused forms: the GEMM's 32-row strips of gate_up (or ds) are rounded to BF16 as packed_matmul
// stores them, then run through the row functions above while they are in the thread's cache. What
// they save is a pass over gate_up (2F values a row) read back from memory: llama_tiny 16 x 256, 11 MB
// a layer each way.
void matmul_swiglu_packed(bf16* out, bf16* gate_up, const bf16* x, const bf16* w, int64_t N, int64_t F, int64_t C,
                          PackedScratch& packed, Workspace& ws, int64_t strips_per_pass) {
  const int threads = omp_get_max_threads();
  const int64_t S = strips_per_pass > 0 ? strips_per_pass : row_strips_per_pass(2 * F, C, threads);
  const int64_t per_thread = gemm_strip_floats(2 * F, S);
  float* strips = ws.floats(static_cast<size_t>(per_thread) * threads, kGemmStripSlot);
  packed_matmul_row_strips(x, w, N, 2 * F, C, true, S, packed, strips, per_thread, [&](float* strip, int64_t ld, int64_t m0, int64_t rows) {
    for (int64_t i = m0; i < m0 + rows; ++i) {
      round_row_to_bf16(strip + (i - m0) * ld, gate_up + i * 2 * F, 2 * F);
      swiglu_forward_row(out + i * F, gate_up + i * 2 * F, F);
    }
  });
}

void matmul_swiglu_backward_packed(bf16* dgate_up, bf16* out, const bf16* dy, const bf16* w_down, const bf16* gate_up,
                                   int64_t N, int64_t F, int64_t C, PackedScratch& packed, Workspace& ws,
                                   int64_t strips_per_pass) {
  const int threads = omp_get_max_threads();
  const int64_t S = strips_per_pass > 0 ? strips_per_pass : row_strips_per_pass(F, C, threads);
  const int64_t per_thread = swiglu_backward_strip_floats(F, S), strip_floats = gemm_strip_floats(F, S);
  float* strips = ws.floats(static_cast<size_t>(per_thread) * threads, kGemmStripSlot);
  packed_matmul_row_strips(dy, w_down, N, F, C, false, S, packed, strips, per_thread, [&](float* strip, int64_t ld, int64_t m0, int64_t rows) {
    // ds's row rounded to BF16 (as packed_matmul would store it) into the BF16 row after the strips.
    bf16* ds = reinterpret_cast<bf16*>(strip + strip_floats);
    for (int64_t i = m0; i < m0 + rows; ++i) {
      round_row_to_bf16(strip + (i - m0) * ld, ds, F);
      if (out)
        swiglu_backward_row<bf16, true>(dgate_up + i * 2 * F, out + i * F, ds, gate_up + i * 2 * F, F);
      else
        swiglu_backward_row<bf16, false>(dgate_up + i * 2 * F, nullptr, ds, gate_up + i * 2 * F, F);
    }
  });
}

template void swiglu_forward<float>(float*, const float*, int64_t, int64_t);
template void swiglu_forward<bf16>(bf16*, const bf16*, int64_t, int64_t);
template void swiglu_backward<float>(float*, float*, const float*, const float*, int64_t, int64_t);
template void swiglu_backward<bf16>(bf16*, bf16*, const bf16*, const bf16*, int64_t, int64_t);

}  // namespace multinorm::cpu
