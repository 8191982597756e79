// SwiGLU: out = silu(g) * u with gate_up[N, 2F] = [g | u], silu(g) = g * sigmoid(g).
// Backward: dg = dout * u * sigmoid(g) * (1 + g * (1 - sigmoid(g))),  du = dout * silu(g); optionally
// the forward's output as well (the model's backward recomputes it rather than storing it).
#include <cmath>

#include "../common/fast_math.h"
#include "../common/op_math.h"
#include "cpu_kernels.h"

namespace multinorm::cpu {

template <class T>
void swiglu_forward(T* out, const T* gate_up, int64_t N, int64_t F) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const T* g = gate_up + i * 2 * F;
    const T* u = g + F;
    T* o = out + i * F;
#pragma omp simd
    for (int64_t f = 0; f < F; ++f) {
      const float gv = to_f32(g[f]);
      o[f] = from_f32<T>(op_math::swiglu(gv, sigmoid_f32(gv), to_f32(u[f])));
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
#pragma omp simd
    for (int64_t f = 0; f < F; ++f) {
      const float gv = to_f32(g[f]), uv = to_f32(u[f]), dv = to_f32(d[f]), sig = sigmoid_f32(gv);
      float a, b;
      op_math::swiglu_grad(gv, sig, uv, dv, a, b);
      dg[f] = from_f32<T>(a);
      du[f] = from_f32<T>(b);
      if constexpr (kOut) o[f] = from_f32<T>(op_math::swiglu(gv, sig, uv));
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
