// exp() for FP32 kernels, branch-free so that loops over it vectorize (glibc's expf is a scalar call
// without -ffast-math, and it dominated softmax, cross-entropy and SwiGLU). Cephes' range reduction
// and degree-6 polynomial: relative error below 2e-7 over [-87, 88]; below -87.3 the result is 0,
// above 88.3 it saturates at exp(88.3); NaN stays NaN.
#pragma once
#include <cstdint>

namespace multinorm {

inline float exp_f32(float x) {
  const float hi = 88.3f, lo = -87.3f;  // 2^n stays a normal float
  const bool underflow = x < lo;
  x = x > hi ? hi : (x < lo ? lo : x);
  // x = n ln2 + r, |r| <= ln2 / 2
  // Round to nearest by adding and subtracting 1.5 * 2^23 (floorf does not vectorize under GCC's
  // default trapping-math).
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  const float z = r * r;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * z + r + 1.0f;
  // A NaN input leaves p NaN, so the result is NaN; the exponent path gets 0 instead of converting
  // NaN to an integer (undefined behaviour).
  const float n_finite = n == n ? n : 0.0f;
  const int32_t bits = (static_cast<int32_t>(n_finite) + 127) << 23;
  const float scale = __builtin_bit_cast(float, bits);
  return underflow ? 0.0f : p * scale;
}

inline float sigmoid_f32(float x) { return 1.0f / (1.0f + exp_f32(-x)); }

}  // namespace multinorm
