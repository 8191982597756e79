// Rounding a row of FP32 values to BF16 with the AVX512-BF16 instruction where the build has it,
// bit for bit as to_bf16 (kernels/common/bf16.h).
//
// Why: the portable to_bf16, vectorised by the compiler, is about nine integer operations per 16
// values (shift, mask, two adds, shift, a NaN compare and select, a pack). VCVTNE2PS2BF16 rounds 32
// values in one instruction, to nearest even, and quiets NaN exactly as to_bf16 does (compared on
// all 2^32 inputs); but it flushes denormal inputs to zero where to_bf16 rounds them, so a block
// holding a denormal takes the scalar path (one class test per 16 values finds it).
// Kernels that produce a BF16 row compute it into an FP32 row in L1 and round it here.
#pragma once
#include <cstdint>
#include <cstring>

#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

#include "../common/bf16.h"

namespace multinorm::cpu {

#if defined(__AVX512BF16__)
// dst[0..32) = to_bf16 of the 32 values lo (the first 16) and hi: one VCVTNE2PS2BF16, or element by
// element where a value is denormal (the instruction flushes those).
inline void store_bf16x32(__m512 lo, __m512 hi, bf16* dst) {
  constexpr int kDenormal = 0x20;  // VFPCLASSPS: denormal inputs
  if (_mm512_fpclass_ps_mask(lo, kDenormal) | _mm512_fpclass_ps_mask(hi, kDenormal)) {
    alignas(64) float f[32];
    _mm512_store_ps(f, lo);
    _mm512_store_ps(f + 16, hi);
    for (int k = 0; k < 32; ++k) dst[k] = to_bf16(f[k]);
    return;
  }
  _mm512_storeu_si512(dst, __builtin_bit_cast(__m512i, _mm512_cvtne2ps_pbh(hi, lo)));  // lo in the low half
}
#endif

// dst[j] = to_bf16(src[j]), or to_bf16(src[j] * scale) with kScaled (a scaling pass and the
// rounding in one), for j < n.
template <bool kScaled>
inline void round_row_to_bf16_scaled_if(const float* src, float scale, bf16* dst, int64_t n) {
  auto value = [&](int64_t k) { return kScaled ? src[k] * scale : src[k]; };
  int64_t j = 0;
#if defined(__AVX512BF16__)
  const __m512 s = _mm512_set1_ps(scale);
  for (; j + 32 <= n; j += 32) {
    __m512 lo = _mm512_loadu_ps(src + j), hi = _mm512_loadu_ps(src + j + 16);
    if constexpr (kScaled) lo = _mm512_mul_ps(lo, s), hi = _mm512_mul_ps(hi, s);
    store_bf16x32(lo, hi, dst + j);
  }
#endif
  for (; j < n; ++j) dst[j] = to_bf16(value(j));
}
inline void round_row_to_bf16(const float* src, bf16* dst, int64_t n) {
  round_row_to_bf16_scaled_if<false>(src, 1.0f, dst, n);
}
inline void round_scaled_row_to_bf16(const float* src, float scale, bf16* dst, int64_t n) {
  round_row_to_bf16_scaled_if<true>(src, scale, dst, n);
}

// A row formed in FP32, stored as the kernel's storage type: copied, or rounded as above.
inline void store_row(const float* x, float* dst, int64_t n) { std::memcpy(dst, x, static_cast<size_t>(n) * sizeof(float)); }
inline void store_row(const float* x, bf16* dst, int64_t n) { round_row_to_bf16(x, dst, n); }

}  // namespace multinorm::cpu
