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
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "cpu_kernels.h"

namespace multinorm::cpu {

namespace {
constexpr int64_t kColumnBlock = 256;
constexpr int64_t kRowGroup = kSinkgdRowGroup;  // rows whose column contributions are added together
enum Slot : size_t { kU = 20, kV, kPartial, kRows };

// sum_j (G_ij v_j)^2 for row g, with 64 independent partial sums (four 16-wide vectors: one
// accumulator would make the loop wait on the FMA latency), added as a tree; the order is fixed by
// n alone. A BF16 row is widened to FP32 into `row` on the way (one shift per element), so the
// column loop after it reads floats; an FP32 row is used in place. Returns the FP32 row.
template <class G>
inline const float* row_sum_squares(const G* g, const float* v, int64_t n, float* row, float& sum) {
  constexpr int64_t kLanes = 64;
  constexpr bool widen = !std::is_same_v<G, float>;
  float acc[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
#pragma omp simd
    for (int64_t k = 0; k < kLanes; ++k) {
      const float x = to_f32(g[j + k]);
      if constexpr (widen) row[j + k] = x;
      const float y = x * v[j + k];
      acc[k] += y * y;
    }
  for (int64_t k = 0; j < n; ++j, ++k) {
    const float x = to_f32(g[j]);
    if constexpr (widen) row[j] = x;
    const float y = x * v[j];
    acc[k] += y * y;
  }
  for (int64_t width = kLanes / 2; width >= 1; width /= 2)  // a tree: log2(64) dependent steps, not 64
#pragma omp simd
    for (int64_t k = 0; k < width; ++k) acc[k] += acc[k + width];
  sum = acc[0];
  if constexpr (widen) return row;
  else return reinterpret_cast<const float*>(g);
}

// Row g in FP32 (widened into `row` when BF16).
inline const float* row_f32(const bf16* g, int64_t n, float* row) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) row[j] = to_f32(g[j]);
  return row;
}
inline const float* row_f32(const float* g, int64_t, float*) { return g; }
}  // namespace

template <class T, class G>
void sinkgd_update(T* w, const G* g, int64_t m, int64_t n, const SinkGDArgs& a, Workspace& ws) {
  float* u = ws.floats(m, kU);
  float* v = ws.floats(n, kV);
  // Fewer, larger chunks than 64 fixed ones: fewer partial rows to add, most written by another core.
  const int64_t chunks = sinkgd_chunks(m);
  float* partial = ws.floats(chunks * n, kPartial);
  const int threads = omp_get_max_threads();
  float* rows = ws.floats(static_cast<size_t>(threads) * kRowGroup * n, kRows);  // a row group per thread
  const float sqrt_n = std::sqrt(static_cast<float>(n)), sqrt_m = std::sqrt(static_cast<float>(m));
  const int64_t rows_per_chunk = (m + chunks - 1) / chunks;
  std::fill(v, v + n, 1.0f);
  const float keep = 1.0f - a.lr * a.decoupled_decay;
  // One parallel region per tensor, its passes separated by barriers: a fork/join per pass cost as
  // much as the passes themselves on small tensors.
#pragma omp parallel
  {
    float* buf = rows + static_cast<size_t>(omp_get_thread_num()) * kRowGroup * n;
    for (int it = 0; it < a.iterations; ++it) {
#pragma omp for schedule(static)
      for (int64_t c = 0; c < chunks; ++c) {
        float* col = partial + c * n;
        std::fill(col, col + n, 0.0f);
        const int64_t end = std::min(m, (c + 1) * rows_per_chunk);
        // Rows in groups of four: their column contributions go into `col` in one pass (one load
        // and store of col per four rows instead of per row; the adds' order is fixed by m alone).
        int64_t i = c * rows_per_chunk;
        for (; i + kRowGroup <= end; i += kRowGroup) {
          const float* x[kRowGroup];
          float u2[kRowGroup];
          for (int64_t q = 0; q < kRowGroup; ++q) {
            float r;
            x[q] = row_sum_squares(g + (i + q) * n, v, n, buf + q * n, r);
            u[i + q] = sqrt_n / std::max(std::sqrt(r), a.eps);
            u2[q] = u[i + q] * u[i + q];
          }
          const float *x0 = x[0], *x1 = x[1], *x2 = x[2], *x3 = x[3];
#pragma omp simd
          for (int64_t j = 0; j < n; ++j)
            col[j] += (u2[0] * x0[j] * x0[j] + u2[1] * x1[j] * x1[j]) + (u2[2] * x2[j] * x2[j] + u2[3] * x3[j] * x3[j]);
        }
        for (; i < end; ++i) {
          float r;
          const float* x = row_sum_squares(g + i * n, v, n, buf, r);
          u[i] = sqrt_n / std::max(std::sqrt(r), a.eps);
          const float u2 = u[i] * u[i];
#pragma omp simd
          for (int64_t j = 0; j < n; ++j) col[j] += u2 * x[j] * x[j];
        }
      }
      // v_j from the chunks' column sums, added in chunk order (0 + p0 + p1 + ...: deterministic).
      // Blocks of columns, chunk rows streamed: the chunks lie n floats apart, and walking them
      // column by column would hit one L1 set 64 times per column.
#pragma omp for schedule(static)
      for (int64_t j0 = 0; j0 < n; j0 += kColumnBlock) {
        const int64_t j1 = std::min(n, j0 + kColumnBlock);
        std::copy(partial + j0, partial + j1, v + j0);
        for (int64_t c = 1; c < chunks; ++c) {
          const float* p = partial + c * n;
#pragma omp simd
          for (int64_t j = j0; j < j1; ++j) v[j] += p[j];
        }
#pragma omp simd
        for (int64_t j = j0; j < j1; ++j) v[j] = sqrt_m / std::max(std::sqrt(v[j]), a.eps);
      }
    }
#pragma omp for schedule(static)
    for (int64_t i = 0; i < m; ++i) {
      const float lu = a.lr * u[i];
      T* wi = w + i * n;
      const float* x = row_f32(g + i * n, n, buf);
      if (!a.write.stochastic) {  // the common case, one vector loop; stochastic rounding hashes per element
#pragma omp simd
        for (int64_t j = 0; j < n; ++j) wi[j] = from_f32<T>(to_f32(wi[j]) * keep - lu * x[j] * v[j]);
      } else {
        for (int64_t j = 0; j < n; ++j)
          wi[j] = write_weight<T>(to_f32(wi[j]) * keep - lu * x[j] * v[j], a.write, static_cast<uint64_t>(i * n + j));
      }
    }
  }
}

// (weights, gradients): FP32/FP32, BF16/BF16 (the paper), BF16 weights with an FP32 gradient arena.
template void sinkgd_update<float, float>(float*, const float*, int64_t, int64_t, const SinkGDArgs&, Workspace&);
template void sinkgd_update<bf16, bf16>(bf16*, const bf16*, int64_t, int64_t, const SinkGDArgs&, Workspace&);
template void sinkgd_update<bf16, float>(bf16*, const float*, int64_t, int64_t, const SinkGDArgs&, Workspace&);

}  // namespace multinorm::cpu
