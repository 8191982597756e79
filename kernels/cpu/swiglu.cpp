// SwiGLU: out = silu(g) * u with gate_up[N, 2F] = [g | u], silu(g) = g * sigmoid(g).
// Backward: dg = dout * u * sigmoid(g) * (1 + g * (1 - sigmoid(g))),  du = dout * silu(g); optionally
// the forward's output as well (the model's backward recomputes it rather than storing it).
#include <algorithm>
#include <cmath>

#include "../common/fast_math.h"
#include "../common/op_math.h"
#include "bf16_rows.h"
#include "cpu_kernels.h"

namespace multinorm::cpu {

namespace {
// Outputs are formed in FP32 blocks of kBlock (on the stack, in L1) and stored by store_row (a BF16
// row rounded 32 values per instruction).
constexpr int64_t kBlock = 256;
}  // namespace

template <class T>
void swiglu_forward(T* out, const T* gate_up, int64_t N, int64_t F) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const T* g = gate_up + i * 2 * F;
    const T* u = g + F;
    T* o = out + i * F;
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
}

namespace {

// With `out`, the forward's output too (the same expression as swiglu_forward: the same bits), for a
// backward that recomputes it: gate_up is read and the sigmoid evaluated once for both.
template <class T, bool kOut>
void swiglu_backward_rows(T* dgate_up, T* out, const T* dout, const T* gate_up, int64_t N, int64_t F) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const T* g = gate_up + i * 2 * F;
    const T* u = g + F;
    const T* d = dout + i * F;
    T* dg = dgate_up + i * 2 * F;
    T* du = dg + F;
    T* o = kOut ? out + i * F : nullptr;
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
}

}  // namespace

template <class T>
void swiglu_backward(T* dgate_up, T* out, const T* dout, const T* gate_up, int64_t N, int64_t F) {
  if (out)
    swiglu_backward_rows<T, true>(dgate_up, out, dout, gate_up, N, F);
  else
    swiglu_backward_rows<T, false>(dgate_up, out, dout, gate_up, N, F);
}

template void swiglu_forward<float>(float*, const float*, int64_t, int64_t);
template void swiglu_forward<bf16>(bf16*, const bf16*, int64_t, int64_t);
template void swiglu_backward<float>(float*, float*, const float*, const float*, int64_t, int64_t);
template void swiglu_backward<bf16>(bf16*, bf16*, const bf16*, const bf16*, int64_t, int64_t);

}  // namespace multinorm::cpu
