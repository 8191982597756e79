// Elementwise copy with dtype conversion (round to nearest even into bf16).
#include <algorithm>
#include <type_traits>

#include "bf16_rows.h"
#include "cpu_kernels.h"

namespace multinorm::cpu {

template <class TO, class TI>
void convert(TO* dst, const TI* src, int64_t n) {
  if constexpr (std::is_same_v<TO, bf16> && std::is_same_v<TI, float>) {
    constexpr int64_t kBlock = 4096;  // rows for round_row_to_bf16 (the AVX512-BF16 rounding)
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < n; b += kBlock) round_row_to_bf16(src + b, dst + b, std::min(kBlock, n - b));
  } else {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) dst[i] = from_f32<TO>(to_f32(src[i]));
  }
}

template void convert<float, float>(float*, const float*, int64_t);
template void convert<float, bf16>(float*, const bf16*, int64_t);
template void convert<bf16, float>(bf16*, const float*, int64_t);
template void convert<bf16, bf16>(bf16*, const bf16*, int64_t);

}  // namespace multinorm::cpu
