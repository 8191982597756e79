// RMSNorm over rows of width C:  out = x * rstd * w,  rstd = 1 / sqrt(mean(x^2) + eps)  (FP32).
// Backward, with xh = x * rstd and g = dout * w:
//   dx = rstd * (g - xh * mean(g * xh))        dw += sum over rows of dout * xh
// dw is reduced in fixed 32-row chunks and then over chunks in order: deterministic whatever the
// thread count. Row sums go into 16 lanes (column c into lane c mod 16), added in lane order at the
// end: one running sum would be a chain of dependent adds, 4 cycles per element, and would keep the
// compiler from vectorising the loop around it (it was most of RMSNorm's time).
#include <cmath>

#include "../common/op_math.h"
#include "bf16_rows.h"
#include "cpu_kernels.h"

namespace multinorm::cpu {

namespace {
constexpr int64_t kChunkRows = 32;
constexpr int64_t kLanes = 16;

inline float lane_total(const float* acc) {
  float s = 0.0f;
  for (int64_t k = 0; k < kLanes; ++k) s += acc[k];
  return s;
}

// sum_c x_c^2 of one row.
template <class T>
float sum_squares_row(const T* x, int64_t C) {
  float acc[kLanes] = {};
  int64_t c = 0;
  for (; c + kLanes <= C; c += kLanes)
#pragma omp simd
    for (int64_t k = 0; k < kLanes; ++k) {
      const float v = to_f32(x[c + k]);
      acc[k] += v * v;
    }
  for (int64_t k = 0; c < C; ++c, ++k) {
    const float v = to_f32(x[c]);
    acc[k] += v * v;
  }
  return lane_total(acc);
}
}  // namespace

template <class T>
void rmsnorm_forward(T* out, float* rstd, const T* x, const T* w, int64_t N, int64_t C, float eps) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const T* xi = x + i * C;
    const float ss = sum_squares_row(xi, C);
    const float r = op_math::rmsnorm_rstd(ss, 1.0f / std::sqrt(ss / static_cast<float>(C) + eps));
    rstd[i] = r;
    T* oi = out + i * C;
    constexpr int64_t kBlock = 256;  // formed in FP32 on the stack, then stored (BF16: 32 per instruction)
    for (int64_t c0 = 0; c0 < C; c0 += kBlock) {
      const int64_t n = std::min(kBlock, C - c0);
      alignas(64) float ob[kBlock];
#pragma omp simd
      for (int64_t c = 0; c < n; ++c) ob[c] = to_f32(xi[c0 + c]) * r * to_f32(w[c0 + c]);
      store_row(ob, oi + c0, n);
    }
  }
}

template <class T, class G>
void rmsnorm_backward(float* dx, G* dw, const float* dout, const T* x, const T* w, const float* rstd, int64_t N, int64_t C,
                      bool accumulate_dx, Workspace& ws) {
  const int64_t chunks = (N + kChunkRows - 1) / kChunkRows;
  float* partial = ws.floats(static_cast<size_t>(chunks) * C);
#pragma omp parallel for schedule(static)
  for (int64_t k = 0; k < chunks; ++k) {
    float* dwk = partial + k * C;
    for (int64_t c = 0; c < C; ++c) dwk[c] = 0.0f;
    const int64_t end = std::min(N, (k + 1) * kChunkRows);
    for (int64_t i = k * kChunkRows; i < end; ++i) {
      const T* xi = x + i * C;
      const float* di = dout + i * C;
      const float r = rstd[i];
      float acc[kLanes] = {};  // sum_c g_c * xh_c, in lanes
      auto step = [&](int64_t c, int64_t k) {
        const float xh = to_f32(xi[c]) * r, d = di[c];
        acc[k] += d * to_f32(w[c]) * xh;
        dwk[c] += d * xh;
      };
      int64_t c0 = 0;
      for (; c0 + kLanes <= C; c0 += kLanes)
#pragma omp simd
        for (int64_t k = 0; k < kLanes; ++k) step(c0 + k, k);
      for (int64_t k = 0; c0 < C; ++c0, ++k) step(c0, k);
      const float mean = lane_total(acc) / static_cast<float>(C);
      float* dxi = dx + i * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) {
        const float v = op_math::rmsnorm_dx(di[c], to_f32(w[c]), to_f32(xi[c]) * r, r, mean);
        dxi[c] = accumulate_dx ? dxi[c] + v : v;
      }
    }
  }
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < C; ++c) {
    float s = 0.0f;
    for (int64_t k = 0; k < chunks; ++k) s += partial[k * C + c];
    dw[c] = from_f32<G>(to_f32(dw[c]) + s);
  }
}

template void rmsnorm_forward<float>(float*, float*, const float*, const float*, int64_t, int64_t, float);
template void rmsnorm_forward<bf16>(bf16*, float*, const bf16*, const bf16*, int64_t, int64_t, float);
// (activations and weights, weight gradient): FP32/FP32, BF16/BF16, BF16 with an FP32 gradient arena.
template void rmsnorm_backward<float, float>(float*, float*, const float*, const float*, const float*, const float*,
                                             int64_t, int64_t, bool, Workspace&);
template void rmsnorm_backward<bf16, bf16>(float*, bf16*, const float*, const bf16*, const bf16*, const float*, int64_t,
                                           int64_t, bool, Workspace&);
template void rmsnorm_backward<bf16, float>(float*, float*, const float*, const bf16*, const bf16*, const float*,
                                            int64_t, int64_t, bool, Workspace&);

}  // namespace multinorm::cpu
