// The gradients' sums of squares (the global norm) and their scaling (clipping), over a tensor.
#include <cmath>

#include "cpu_kernels.h"

namespace multinorm::cpu {

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
