// The CPU kernels' vector helpers, compiled as the core library compiles them (-march=native unless
// MULTINORM_NATIVE is off: tests/CMakeLists.txt), so that the AVX-512 paths run where the build has them
// and are checked against the scalar and `omp simd` code they stand for.
#include <gtest/gtest.h>
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "../kernels/common/fast_math.h"
#include "../kernels/cpu/exp_rows.h"

using namespace multinorm;

// exp16_f32 (kernels/cpu/exp_rows.h) is exp_f32 on every one of the 2^32 FP32 inputs, bit for bit:
// normals, the clamped ranges, the underflow to 0, denormals, infinities, NaNs (compared as bits);
// exp_f32 as the loops it replaced vectorized it, and as a scalar call (the rows' tails) on one block
// of 16 inputs in 255.
namespace {
[[gnu::noinline]] float exp_f32_scalar(float x) { return exp_f32(x); }
}  // namespace
TEST(FastMath, Exp16IsExpF32OnEveryFloat) {
#if defined(__AVX512F__)
  int64_t wrong = 0, wrong_scalar = 0;
  uint32_t first = 0;
  alignas(64) float x[16], got[16], want[16];
  for (uint64_t base = 0; base < (uint64_t{1} << 32); base += 16) {
    for (uint32_t k = 0; k < 16; ++k) {
      const uint32_t u = static_cast<uint32_t>(base) + k;
      std::memcpy(&x[k], &u, 4);
    }
#pragma omp simd
    for (int k = 0; k < 16; ++k) want[k] = exp_f32(x[k]);
    _mm512_store_ps(got, cpu::exp16_f32(_mm512_load_ps(x)));
    if (std::memcmp(want, got, sizeof(got)) != 0 && wrong++ == 0) first = static_cast<uint32_t>(base);
    if (base % (255 * 16) == 0)
      for (int k = 0; k < 16; ++k) {
        const float scalar = exp_f32_scalar(x[k]);
        wrong_scalar += std::memcmp(&scalar, &got[k], 4) != 0;
      }
  }
  EXPECT_EQ(wrong, 0) << "first in the block from input bits " << std::hex << first;
  EXPECT_EQ(wrong_scalar, 0);
#else
  GTEST_SKIP() << "built without AVX-512";
#endif
}

// The loops exp_rows.h replaced, as the kernels wrote them: `omp simd` with a sum reduction.
namespace {
[[gnu::noinline]] float omp_simd_exp_sum(float* e, const float* x, float m, int64_t n) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t v = 0; v < n; ++v) {
    e[v] = exp_f32(x[v] - m);
    sum += e[v];
  }
  return sum;
}
[[gnu::noinline]] float omp_simd_exp_sum_scaled(float* s, float scale, float m, int64_t n) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < n; ++j) {
    s[j] = exp_f32(scale * (s[j] - m));
    sum += s[j];
  }
  return sum;
}
[[gnu::noinline]] void omp_simd_exp_minus(float* s, float scale, const float* l, int64_t n) {
#pragma omp simd
  for (int64_t c = 0; c < n; ++c) s[c] = exp_f32(scale * s[c] - l[c]);
}
[[gnu::noinline]] void omp_simd_exp_minus_one(float* s, float scale, float l, int64_t n) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) s[j] = exp_f32(scale * s[j] - l);
}
// The sum of e[0..n) in exp_rows.h's documented order: with AVX-512, whole vectors of 16 into lanes
// j mod 16, the last n mod 16 values into lane 0, then 0 + lane 0 + ... + lane 15 (the order GCC 12's
// `omp simd reduction` used where the kernels were written, a Zen 4; GCC picks another for some
// lengths on a Sapphire Rapids, so the order is asserted, not GCC's choice); without it, the `omp
// simd` loop the kernel still is.
float documented_sum(const std::vector<float>& e, float omp_simd_sum) {
#if defined(__AVX512F__)
  (void)omp_simd_sum;
  const int64_t n = static_cast<int64_t>(e.size()), whole = n / 16 * 16;
  float lanes[16] = {}, sum = 0.0f;
  for (int64_t j = 0; j < whole; ++j) lanes[j % 16] += e[j];
  for (int64_t j = whole; j < n; ++j) lanes[0] += e[j];
  for (const float lane : lanes) sum += lane;
  return sum;
#else
  return omp_simd_sum;
#endif
}
}  // namespace

// The softmaxes' exp rows (the cross-entropy's and attention's) give the bits of the `omp simd`
// loops they replaced, element by element, and sum them in their documented order, for every length
// from 0 to 100 (whole vectors, a tail, no vector at all) and arguments from the underflow to the
// clamp.
TEST(FastMath, ExpRowsKeepTheOmpSimdLoopsBits) {
  std::mt19937 gen(5);
  std::normal_distribution<float> d(0.0f, 30.0f);
  for (int64_t n = 0; n <= 100; ++n) {
    std::vector<float> x(n), l(n), a(n), b(n);
    for (int64_t j = 0; j < n; ++j) x[j] = d(gen), l[j] = d(gen);
    const float m = n > 0 ? *std::max_element(x.begin(), x.end()) : 0.0f, scale = 0.37f;
    const float simd = omp_simd_exp_sum(a.data(), x.data(), m, n), got = cpu::exp_sum_shifted(b.data(), x.data(), m, n);
    const float want = documented_sum(a, simd);
    EXPECT_EQ(std::memcmp(&want, &got, 4), 0) << "n " << n;
    EXPECT_EQ(a, b) << "n " << n;
    const float alone = cpu::exp_sum_shifted(nullptr, x.data(), m, n);  // the loss without the gradient
    EXPECT_EQ(std::memcmp(&want, &alone, 4), 0) << "n " << n;
    a = x, b = x;
    const float simd_s = omp_simd_exp_sum_scaled(a.data(), scale, m, n), got_s = cpu::exp_sum_scaled(b.data(), scale, m, n);
    const float want_s = documented_sum(a, simd_s);
    EXPECT_EQ(std::memcmp(&want_s, &got_s, 4), 0) << "n " << n;
    EXPECT_EQ(a, b) << "n " << n;
    a = x, b = x;
    omp_simd_exp_minus(a.data(), scale, l.data(), n);
    cpu::exp_scaled_minus(b.data(), scale, l.data(), n);
    EXPECT_EQ(a, b) << "n " << n;
    a = x, b = x;
    omp_simd_exp_minus_one(a.data(), scale, 3.0f, n);
    cpu::exp_scaled_minus(b.data(), scale, 3.0f, n);
    EXPECT_EQ(a, b) << "n " << n;
  }
}
