// Softmax cross-entropy over rows of FP32 logits[N, V], fused with its gradient so probabilities are
// never written:
//   loss_i = log(sum_v exp(x_v - m)) + m - x_target            (0 where mask_i == 0)
//   dlogits_i = (softmax(x_i) - onehot(target_i)) * grad_scale  (0 where mask_i == 0)
// Per row: one pass for the max m; one for e_v = exp(x_v - m) and their sum, the e_v kept in a
// per-thread FP32 row (V floats, L1/L2); with a gradient, one pass scaling e_v into dlogits. Each
// exponential is evaluated once (the exponential is most of the kernel's work: ~20 vector operations
// per element against a handful for the rest). Bytes: logits read once from memory (the row then
// stays in cache), dlogits written once.
#include <omp.h>

#include <cmath>
#include <type_traits>

#include "../common/fast_math.h"
#include "bf16_rows.h"
#include "cpu_kernels.h"

namespace multinorm::cpu {

template <class T>
void cross_entropy(float* losses, T* dlogits, const float* logits, const int32_t* targets, const uint8_t* mask,
                   int64_t N, int64_t V, float grad_scale, Workspace& ws) {
  float* rows = dlogits ? ws.floats(static_cast<size_t>(V) * omp_get_max_threads(), kCrossEntropyRowSlot) : nullptr;
#pragma omp parallel
  {
    float* e = rows ? rows + static_cast<size_t>(omp_get_thread_num()) * V : nullptr;
#pragma omp for schedule(static)
    for (int64_t i = 0; i < N; ++i) {
      const float* x = logits + i * V;
      T* d = dlogits ? dlogits + i * V : nullptr;
      if (mask && !mask[i]) {
        losses[i] = 0.0f;
        if (d)
          for (int64_t v = 0; v < V; ++v) d[v] = from_f32<T>(0.0f);
        continue;
      }
      const float m = max_f32(x, V);
      const int32_t t = targets[i];
      const float xt = x[t];  // read before the row is overwritten (dlogits may alias logits)
      float sum = 0.0f;
      if (e) {
#pragma omp simd reduction(+ : sum)
        for (int64_t v = 0; v < V; ++v) {
          e[v] = exp_f32(x[v] - m);
          sum += e[v];
        }
      } else {
#pragma omp simd reduction(+ : sum)
        for (int64_t v = 0; v < V; ++v) sum += exp_f32(x[v] - m);
      }
      losses[i] = std::log(sum) + m - xt;
      if (d) {
        const float scale = grad_scale / sum, et = e[t];
        if constexpr (std::is_same_v<T, bf16>) {  // formed in e, then rounded 32 values per instruction
#pragma omp simd
          for (int64_t v = 0; v < V; ++v) e[v] *= scale;
          e[t] = (et / sum - 1.0f) * grad_scale;
          round_row_to_bf16(e, d, V);
        } else {
#pragma omp simd
          for (int64_t v = 0; v < V; ++v) d[v] = e[v] * scale;
          d[t] = (et / sum - 1.0f) * grad_scale;
        }
      }
    }
  }
}

template void cross_entropy<float>(float*, float*, const float*, const int32_t*, const uint8_t*, int64_t, int64_t, float,
                                   Workspace&);
template void cross_entropy<bf16>(float*, bf16*, const float*, const int32_t*, const uint8_t*, int64_t, int64_t, float,
                                  Workspace&);

}  // namespace multinorm::cpu
