// Softmax cross-entropy over rows of FP32 logits[N, V], fused with its gradient so probabilities are
// never written:
//   loss_i = log(sum_v exp(x_v - m)) + m - x_target            (0 where mask_i == 0)
//   dlogits_i = (softmax(x_i) - onehot(target_i)) * grad_scale  (0 where mask_i == 0)
// Per row: one pass for the max m; one for e_v = exp(x_v - m) and their sum, the e_v kept in a
// per-thread FP32 row (V floats, L1/L2); with a gradient, one pass scaling e_v into dlogits. Each
// exponential is evaluated once (it is most of the kernel's work: 17 vector operations per 16 values
// with AVX-512, exp_rows.h, against a handful for the rest). Bytes: logits read once from memory (the
// row then stays in cache), dlogits written once.
//
// The loss head (linear_cross_entropy_packed) runs the same rows on logits = x w^T as the packed GEMM
// computes them, 32 rows at a time into per-thread strips (32 x V FP32 each: 1 MB at V = 8192; 4 MB at
// V = 32000, where a thread forms four per pass over w on the 2-core Zen 4: row_strips_per_pass), so the
// [N, V] FP32 logits are never written to memory and read back (2 x 4 N V bytes; llama_tiny at
// 16 x 256: 268 MB a step). Same bits as the GEMM followed by cross_entropy.
#include <omp.h>

#include <cmath>
#include <type_traits>

#include "../common/optim_math.h"

#include "bf16_rows.h"
#include "cpu_kernels.h"
#include "exp_rows.h"
#include "matmul_packed.h"

namespace multinorm::cpu {

namespace {

// One row x[V] with target t: the loss and, with d, the gradient row. e: V FP32 of scratch for the
// exponentials (may be x itself, when x is scratch), or null without d. d may alias x (FP32).
template <class T>
void cross_entropy_row(float* loss, T* d, const float* x, int32_t t, bool masked, int64_t V, float grad_scale, float* e) {
  if (masked) {
    *loss = 0.0f;
    if (d)
      for (int64_t v = 0; v < V; ++v) d[v] = from_f32<T>(0.0f);
    return;
  }
  const float m = max_f32(x, V);
  const float xt = x[t];  // read before the row is overwritten (dlogits or e may alias logits)
  const float sum = exp_sum_shifted(d ? e : nullptr, x, m, V);
  *loss = std::log(sum) + m - xt;
  if (!d) return;
  const float scale = grad_scale / sum, et = e[t];
  if constexpr (std::is_same_v<T, bf16>) {  // scaled and rounded 32 values at a time, in one pass
    round_scaled_row_to_bf16(e, scale, d, V);
    d[t] = to_bf16((et / sum - 1.0f) * grad_scale);
  } else {
#pragma omp simd
    for (int64_t v = 0; v < V; ++v) d[v] = e[v] * scale;
    d[t] = (et / sum - 1.0f) * grad_scale;
  }
}

}  // namespace

template <class T>
void cross_entropy(float* losses, T* dlogits, const float* logits, const int32_t* targets, const uint8_t* mask,
                   int64_t N, int64_t V, float grad_scale, Workspace& ws) {
  float* rows = dlogits ? ws.floats(static_cast<size_t>(V) * omp_get_max_threads(), kCrossEntropyRowSlot) : nullptr;
#pragma omp parallel
  {
    float* e = rows ? rows + static_cast<size_t>(omp_get_thread_num()) * V : nullptr;
#pragma omp for schedule(static)
    for (int64_t i = 0; i < N; ++i)
      cross_entropy_row(losses + i, dlogits ? dlogits + i * V : nullptr, logits + i * V, targets[i], mask && !mask[i], V,
                        grad_scale, e);
  }
}

void linear_cross_entropy_packed(float* losses, bf16* dlogits, const bf16* x, const bf16* w, const int32_t* targets,
                                 const uint8_t* mask, int64_t N, int64_t V, int64_t C, float grad_scale,
                                 PackedScratch& packed, Workspace& ws, int64_t strips_per_pass) {
  const int threads = omp_get_max_threads();
  const int64_t S = strips_per_pass > 0 ? strips_per_pass : row_strips_per_pass(V, C, threads);
  const int64_t per_thread = gemm_strip_floats(V, S);
  float* strips = ws.floats(static_cast<size_t>(per_thread) * threads, kGemmStripSlot);
  packed_matmul_row_strips(x, w, N, V, C, true, S, packed, strips, per_thread, [&](float* strip, int64_t ld, int64_t m0, int64_t rows) {
    for (int64_t r = 0; r < rows; ++r) {  // the exponentials overwrite the strip's row
      const int64_t i = m0 + r;
      float* row = strip + r * ld;
      cross_entropy_row(losses + i, dlogits ? dlogits + i * V : nullptr, row, targets[i], mask && !mask[i], V,
                        grad_scale, row);
    }
  });
}

// Sequential within each lane (N is a micro-batch's positions: thousands, a few microseconds).
void accumulate_loss(LossTotals* totals, const float* losses, const uint8_t* mask, int64_t N) {
  double lanes[optim_math::kLossLanes] = {};
  int64_t count = 0;
  for (int64_t i = 0; i < N; ++i)
    if (mask[i]) {
      lanes[i % optim_math::kLossLanes] += losses[i];
      ++count;
    }
  double sum = 0;
  for (const double lane : lanes) sum += lane;
  optim_math::add_micro_batch_loss(*totals, sum, count);
}

template void cross_entropy<float>(float*, float*, const float*, const int32_t*, const uint8_t*, int64_t, int64_t, float,
                                   Workspace&);
template void cross_entropy<bf16>(float*, bf16*, const float*, const int32_t*, const uint8_t*, int64_t, int64_t, float,
                                  Workspace&);

}  // namespace multinorm::cpu
