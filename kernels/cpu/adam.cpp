// Adam / AdamW with torch.optim semantics, one fused pass reading g, m, v, w and writing m, v, w:
//   g += l2_decay * w                          (Adam's weight_decay)
//   m = b1 m + (1 - b1) g        v = b2 v + (1 - b2) g^2
//   w <- w (1 - lr decoupled_decay) - lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
// States are stored in their own dtype (BF16 as in the paper, or FP32), rounded to nearest.
#include <cmath>

#include "../common/optim_math.h"
#include "cpu_kernels.h"

namespace multinorm::cpu {

template <class T, class G, class S>
void adam_update(T* w, const G* g, S* m, S* v, int64_t n, const AdamScalars& s, const WriteBack& wb) {
  if (!wb.stochastic) {  // one vector loop (stochastic rounding hashes each element's index)
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      float mi = to_f32(m[i]), vi = to_f32(v[i]);
      const float wi = optim_math::adam_element(to_f32(w[i]), to_f32(g[i]), mi, vi, s);
      m[i] = from_f32<S>(mi);
      v[i] = from_f32<S>(vi);
      w[i] = from_f32<T>(wi);
    }
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    float mi = to_f32(m[i]), vi = to_f32(v[i]);
    const float wi = optim_math::adam_element(to_f32(w[i]), to_f32(g[i]), mi, vi, s);
    m[i] = from_f32<S>(mi);
    v[i] = from_f32<S>(vi);
    w[i] = write_weight<T>(wi, wb, static_cast<uint64_t>(i));
  }
}

template <class T, class G, class S>
void sgd_update(T* w, const G* g, S* buf, int64_t n, const SgdArgs& a) {
  const float keep = 1.0f - a.lr * a.decoupled_decay;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    float d = to_f32(g[i]);
    if (buf) {
      d = a.momentum * to_f32(buf[i]) + d;
      buf[i] = from_f32<S>(d);
    }
    w[i] = write_weight<T>(to_f32(w[i]) * keep - a.lr * d, a.write, static_cast<uint64_t>(i));
  }
}

// (weights, gradients, states): every state dtype for FP32/FP32, BF16/BF16 and BF16 weights with FP32
// gradients.
#define MULTINORM_INSTANTIATE(T, G, S)                                                   \
  template void adam_update<T, G, S>(T*, const G*, S*, S*, int64_t, const AdamScalars&, const WriteBack&); \
  template void sgd_update<T, G, S>(T*, const G*, S*, int64_t, const SgdArgs&);
MULTINORM_INSTANTIATE(float, float, float)
MULTINORM_INSTANTIATE(float, float, bf16)
MULTINORM_INSTANTIATE(bf16, bf16, float)
MULTINORM_INSTANTIATE(bf16, bf16, bf16)
MULTINORM_INSTANTIATE(bf16, float, float)
MULTINORM_INSTANTIATE(bf16, float, bf16)
#undef MULTINORM_INSTANTIATE

template <class T>
double sum_squares(const T* x, int64_t n) {
  // Fixed blocks summed in order: deterministic for any thread count.
  constexpr int64_t kBlock = 1 << 16;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> part(blocks);
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    // 16 partial sums in lanes (vectors of doubles), not one latency-bound chain; which element
    // goes to which lane is fixed by its index alone.
    constexpr int64_t kLanes = 16;
    double acc[kLanes] = {};
    const int64_t begin = b * kBlock, end = std::min(n, (b + 1) * kBlock);
    int64_t i = begin;
    for (; i + kLanes <= end; i += kLanes)
#pragma omp simd
      for (int64_t k = 0; k < kLanes; ++k) {
        const double v = to_f32(x[i + k]);
        acc[k] += v * v;
      }
    for (int64_t k = 0; i < end; ++i, ++k) {
      const double v = to_f32(x[i]);
      acc[k] += v * v;
    }
    double s = 0;
    for (int64_t k = 0; k < kLanes; ++k) s += acc[k];
    part[b] = s;
  }
  double s = 0;
  for (double p : part) s += p;
  return s;
}

template <class T>
void scale(T* x, int64_t n, float factor) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) x[i] = from_f32<T>(to_f32(x[i]) * factor);
}

template double sum_squares<float>(const float*, int64_t);
template double sum_squares<bf16>(const bf16*, int64_t);
template void scale<float>(float*, int64_t, float);
template void scale<bf16>(bf16*, int64_t, float);

}  // namespace multinorm::cpu
