// Rotary position embedding, rotate-half layout (dimension i pairs with i + D/2), in place on the q
// and k sections of qkv[B*T, 3*H*D] (row layout [q heads | k heads | v heads]):
//   x'_i      = x_i cos(p w_i) - x_{i+h} sin(p w_i)        w_i = theta^(-2i/D), h = D/2
//   x'_{i+h}  = x_{i+h} cos(p w_i) + x_i sin(p w_i)
// The backward pass applies the transposed (inverse) rotation to the gradient.
#include <algorithm>

#include "../common/op_math.h"
#include "bf16_rows.h"
#include "cpu_kernels.h"

namespace multinorm::cpu {

template <class T>
void rope_forward(T* qkv, const float* cos_sin, int64_t B, int64_t T_, int64_t H, int64_t D, bool inverse) {
  const int64_t C = H * D, half = D / 2;
  const float sign = inverse ? -1.0f : 1.0f;
#pragma omp parallel for schedule(static)
  for (int64_t bt = 0; bt < B * T_; ++bt) {
    const int64_t pos = bt % T_;
    const float* cs = cos_sin + pos * half * 2;
    for (int64_t section = 0; section < 2; ++section) {  // q, then k
      for (int64_t h = 0; h < H; ++h) {
        T* x = qkv + bt * 3 * C + section * C + h * D;
        constexpr int64_t kBlock = 64;  // formed in FP32 on the stack, then stored (BF16: 32 per instruction)
        for (int64_t i0 = 0; i0 < half; i0 += kBlock) {
          const int64_t n = std::min(kBlock, half - i0);
          alignas(64) float ab[kBlock], bb[kBlock];
#pragma omp simd
          for (int64_t i = 0; i < n; ++i) {
            const float c = cs[2 * (i0 + i)], s = sign * cs[2 * (i0 + i) + 1];
            op_math::rope_rotate(to_f32(x[i0 + i]), to_f32(x[i0 + i + half]), c, s, ab[i], bb[i]);
          }
          store_row(ab, x + i0, n);
          store_row(bb, x + i0 + half, n);
        }
      }
    }
  }
}

template void rope_forward<float>(float*, const float*, int64_t, int64_t, int64_t, int64_t, bool);
template void rope_forward<bf16>(bf16*, const float*, int64_t, int64_t, int64_t, int64_t, bool);

}  // namespace multinorm::cpu
