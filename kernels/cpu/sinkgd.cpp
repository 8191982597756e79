// SinkGD (SR-Sinkhorn), fused. For W, G of shape [m, n]:
//   X = G; repeat L times: rows of X to norm sqrt(n), then columns of X to norm sqrt(m);
//   W <- W (1 - lr wd) - lr X
// X is never materialised: X = diag(u) G diag(v), with
//   row step     u_i = sqrt(n) / max(||G_i,: o v||, eps)
//   column step  v_j = sqrt(m) / max(||u o G_:,j||, eps)
// Each iteration is ONE pass over G: a row's norm gives u_i at once, and the same row then adds
// u_i^2 G_ij^2 into the column sums. Column sums are reduced over a fixed number of row chunks, in
// order: the result is independent of the thread count. A zero row (column) gets a finite scale
// and contributes zero, so it receives a zero update, never NaN. Cost: L + 1 passes over G, plus
// the read and write of W: the same order as Adam's traffic, and no state.
#include <algorithm>
#include <cmath>

#include "cpu_kernels.h"

namespace multinorm::cpu {

namespace {
constexpr int64_t kChunks = 64;
enum Slot : size_t { kU = 20, kV, kPartial };
}  // namespace

template <class T, class G>
void sinkgd_update(T* w, const G* g, int64_t m, int64_t n, const SinkGDArgs& a, Workspace& ws) {
  float* u = ws.floats(m, kU);
  float* v = ws.floats(n, kV);
  float* partial = ws.floats(kChunks * n, kPartial);
  const float sqrt_n = std::sqrt(static_cast<float>(n)), sqrt_m = std::sqrt(static_cast<float>(m));
  const int64_t rows_per_chunk = (m + kChunks - 1) / kChunks;
  std::fill(v, v + n, 1.0f);
  for (int it = 0; it < a.iterations; ++it) {
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < kChunks; ++c) {
      float* col = partial + c * n;
      std::fill(col, col + n, 0.0f);
      const int64_t end = std::min(m, (c + 1) * rows_per_chunk);
      for (int64_t i = c * rows_per_chunk; i < end; ++i) {
        const G* gi = g + i * n;
        float r = 0.0f;
#pragma omp simd reduction(+ : r)
        for (int64_t j = 0; j < n; ++j) {
          const float x = to_f32(gi[j]) * v[j];
          r += x * x;
        }
        u[i] = sqrt_n / std::max(std::sqrt(r), a.eps);
        const float u2 = u[i] * u[i];
#pragma omp simd
        for (int64_t j = 0; j < n; ++j) {
          const float x = to_f32(gi[j]);
          col[j] += u2 * x * x;
        }
      }
    }
#pragma omp parallel for schedule(static)
    for (int64_t j = 0; j < n; ++j) {
      float s = 0.0f;
      for (int64_t c = 0; c < kChunks; ++c) s += partial[c * n + j];
      v[j] = sqrt_m / std::max(std::sqrt(s), a.eps);
    }
  }
  const float keep = 1.0f - a.lr * a.decoupled_decay;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < m; ++i) {
    const float lu = a.lr * u[i];
    T* wi = w + i * n;
    const G* gi = g + i * n;
    for (int64_t j = 0; j < n; ++j)
      wi[j] = write_weight<T>(to_f32(wi[j]) * keep - lu * to_f32(gi[j]) * v[j], a.write, static_cast<uint64_t>(i * n + j));
  }
}

// (weights, gradients): FP32/FP32, BF16/BF16 (the paper), BF16 weights with an FP32 gradient arena.
template void sinkgd_update<float, float>(float*, const float*, int64_t, int64_t, const SinkGDArgs&, Workspace&);
template void sinkgd_update<bf16, bf16>(bf16*, const bf16*, int64_t, int64_t, const SinkGDArgs&, Workspace&);
template void sinkgd_update<bf16, float>(bf16*, const float*, int64_t, int64_t, const SinkGDArgs&, Workspace&);

}  // namespace multinorm::cpu
