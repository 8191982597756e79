// Softmax cross-entropy over rows of FP32 logits[N, V], fused with its gradient so probabilities are
// never written: one pass for the max, one for the sum of exponentials, one writing dlogits.
//   loss_i = log(sum_v exp(x_v - m)) + m - x_target            (0 where mask_i == 0)
//   dlogits_i = (softmax(x_i) - onehot(target_i)) * grad_scale  (0 where mask_i == 0)
#include <cmath>

#include "../common/fast_math.h"
#include "cpu_kernels.h"

namespace multinorm::cpu {

template <class T>
void cross_entropy(float* losses, T* dlogits, const float* logits, const int32_t* targets, const uint8_t* mask,
                   int64_t N, int64_t V, float grad_scale) {
#pragma omp parallel for schedule(static)
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
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t v = 0; v < V; ++v) sum += exp_f32(x[v] - m);
    const int32_t t = targets[i];
    losses[i] = std::log(sum) + m - x[t];
    if (d) {
      const float scale = grad_scale / sum;
      const float xt = x[t];  // read before the row is overwritten (dlogits may alias logits)
#pragma omp simd
      for (int64_t v = 0; v < V; ++v) d[v] = from_f32<T>(exp_f32(x[v] - m) * scale);
      d[t] = from_f32<T>((exp_f32(xt - m) / sum - 1.0f) * grad_scale);
    }
  }
}

template void cross_entropy<float>(float*, float*, const float*, const int32_t*, const uint8_t*, int64_t, int64_t, float);
template void cross_entropy<bf16>(float*, bf16*, const float*, const int32_t*, const uint8_t*, int64_t, int64_t, float);

}  // namespace multinorm::cpu
