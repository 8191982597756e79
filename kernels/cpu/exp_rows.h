// Rows of exp_f32 (kernels/common/fast_math.h) for the CPU kernels' softmaxes (the cross-entropy's and
// attention's): exp16_f32 evaluates it on 16 floats with AVX-512, and exp_row writes exp_f32 of a
// row of arguments and adds them up, with the bits of the `omp simd` loops it replaces.
//
// exp16_f32: the same operations in the same order as exp_f32, each rounded as GCC rounds them when
// it vectorizes exp_f32 (the multiply-adds fused: GCC contracts them), so the same bits on every
// input (tests: FastMath.Exp16IsExpF32OnEveryFloat, all 2^32). What differs is how: the clamp is one
// VMAXPS and one VMINPS (each returns its second operand when one is NaN, so NaN stays NaN, as
// exp_f32's two selects leave it), and p 2^n one VSCALEFPS (n is an integer in [-126, 127] after the
// clamp, so the product is rounded once either way), where GCC formed 2^n with integer operations
// under masks and evaluated the clamped lanes apart with blends: 17 vector operations per 16 values
// against about 35. One Zen 4 core, an exp-and-sum pass over 8192 floats in L1: 0.336 -> 0.223 ns a
// value (the pass is then bound by its 11 multiply-adds per 16 values).
#pragma once
#include <cstdint>

#include "../common/fast_math.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace multinorm::cpu {

#if defined(__AVX512F__)
// GCC 12 reports the intrinsics' own _mm512_undefined_* placeholders as uninitialised (bug 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
inline __m512 exp16_f32(__m512 x) {
  const __m512 lo = _mm512_set1_ps(-87.3f), hi = _mm512_set1_ps(88.3f), shifter = _mm512_set1_ps(12582912.0f);
  const __mmask16 keep = _mm512_cmp_ps_mask(x, lo, _CMP_NLT_UQ);  // not below lo (NaN kept); below it, 0
  x = _mm512_min_ps(hi, _mm512_max_ps(lo, x));
  const __m512 n = _mm512_sub_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), shifter), shifter);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);  // r - n (-2.12194440e-4), one rounding
  const __m512 z = _mm512_mul_ps(r, r);
  __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(1.9875691500e-4f), r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_add_ps(_mm512_fmadd_ps(p, z, r), _mm512_set1_ps(1.0f));
  return _mm512_maskz_scalef_ps(keep, p, n);
}
#pragma GCC diagnostic pop
#endif

// out[j] = exp_f32(arg(j)) for j in [0, n) (with kSum out may be null: not stored), returning their
// sum when kSum (0 otherwise).
// arg(j) is the scalar argument; arg16(j), where AVX-512 is compiled in, the 16 arguments j..j+15 as a
// vector, rounded as GCC rounds arg(j) in a vectorized loop. The sum runs in the order of GCC 12's
// `omp simd reduction(+)` loop, which the kernels used before: whole vectors of 16 into lanes j mod 16,
// the last n mod 16 values one by one into lane 0, then 0 + lane 0 + lane 1 + ... + lane 15; so the
// softmaxes keep their bits (a 4-update quickstart run's losses are the same). Use the forms below.
template <bool kSum, class Arg, class Arg16>
inline float exp_row(float* out, int64_t n, const Arg& arg, [[maybe_unused]] const Arg16& arg16) {
  int64_t j = 0;
  float sum = 0.0f;
#if defined(__AVX512F__)
  __m512 acc = _mm512_setzero_ps();
  for (; j + 16 <= n; j += 16) {
    const __m512 e = exp16_f32(arg16(j));
    if (out) _mm512_storeu_ps(out + j, e);
    if constexpr (kSum) acc = _mm512_add_ps(acc, e);
  }
  if constexpr (kSum) {
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, acc);
    for (; j < n; ++j) {
      const float e = exp_f32(arg(j));
      if (out) out[j] = e;
      lanes[0] += e;
    }
    for (const float lane : lanes) sum += lane;
  } else {
    for (; j < n; ++j) out[j] = exp_f32(arg(j));
  }
#else
  if constexpr (!kSum) {
#pragma omp simd
    for (j = 0; j < n; ++j) out[j] = exp_f32(arg(j));
  } else if (out) {
#pragma omp simd reduction(+ : sum)
    for (j = 0; j < n; ++j) sum += (out[j] = exp_f32(arg(j)));
  } else {
#pragma omp simd reduction(+ : sum)
    for (j = 0; j < n; ++j) sum += exp_f32(arg(j));
  }
#endif
  return sum;
}

// The forms the kernels use. Each argument as the loops it replaces formed it.
// e[j] = exp(x[j] - m) (e null: not stored; e may be x), and their sum: the cross-entropy's row.
inline float exp_sum_shifted(float* e, const float* x, float m, int64_t n) {
  const auto arg = [&](int64_t j) { return x[j] - m; };
#if defined(__AVX512F__)
  const __m512 m16 = _mm512_set1_ps(m);
  return exp_row<true>(e, n, arg, [&](int64_t j) { return _mm512_sub_ps(_mm512_loadu_ps(x + j), m16); });
#else
  return exp_row<true>(e, n, arg, arg);
#endif
}
// s[j] = exp(scale (s[j] - m)), and their sum: attention's forward row.
inline float exp_sum_scaled(float* s, float scale, float m, int64_t n) {
  const auto arg = [&](int64_t j) { return scale * (s[j] - m); };
#if defined(__AVX512F__)
  const __m512 scale16 = _mm512_set1_ps(scale), m16 = _mm512_set1_ps(m);
  return exp_row<true>(s, n, arg, [&](int64_t j) { return _mm512_mul_ps(scale16, _mm512_sub_ps(_mm512_loadu_ps(s + j), m16)); });
#else
  return exp_row<true>(s, n, arg, arg);
#endif
}
// s[j] = exp(scale s[j] - l[j]): attention's backward rows from the saved log-sum-exps.
inline void exp_scaled_minus(float* s, float scale, const float* l, int64_t n) {
  const auto arg = [&](int64_t j) { return scale * s[j] - l[j]; };
#if defined(__AVX512F__)
  const __m512 scale16 = _mm512_set1_ps(scale);
  exp_row<false>(s, n, arg, [&](int64_t j) { return _mm512_fmsub_ps(scale16, _mm512_loadu_ps(s + j), _mm512_loadu_ps(l + j)); });
#else
  exp_row<false>(s, n, arg, arg);
#endif
}
// s[j] = exp(scale s[j] - l): the same with one log-sum-exp for the row.
inline void exp_scaled_minus(float* s, float scale, float l, int64_t n) {
  const auto arg = [&](int64_t j) { return scale * s[j] - l; };
#if defined(__AVX512F__)
  const __m512 scale16 = _mm512_set1_ps(scale), l16 = _mm512_set1_ps(l);
  exp_row<false>(s, n, arg, [&](int64_t j) { return _mm512_fmsub_ps(scale16, _mm512_loadu_ps(s + j), l16); });
#else
  exp_row<false>(s, n, arg, arg);
#endif
}

}  // namespace multinorm::cpu
