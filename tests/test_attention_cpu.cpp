// The CPU backend's blocked causal attention (kernels/cpu/attention.cpp) on each block engine the CPU
// has: FP32 and BF16 on the portable vector path, BF16 on AVX512_BF16 and on the AMX tiles. Against an
// FP64 reference of the forward, the log-sum-exp and the analytic backward, on shapes that cross the
// 32-row tile (T = 1, 31, 32, 33, 100; head sizes 64, as every model has, and 5 or 40, padded to the
// tile); then the padding: rows past T in the last tile, stale scratch from a larger call and a
// NaN-filled neighbouring sequence must not reach any output; and bit-identical results for any
// thread count.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "../kernels/cpu/cpu_kernels.h"
#include "../kernels/cpu/matmul_packed.h"
#include "test_support.h"

using namespace multinorm;
using namespace multinorm::testing;

namespace {

struct Shape {
  int64_t B, T, H, D;
};

struct Engine {
  const char* name;
  bool bf16_storage;
  cpu::AttentionEngine engine;
};

// The engines this CPU can run.
std::vector<Engine> engines() {
  using E = cpu::AttentionEngine;
  std::vector<Engine> e = {{"portable FP32", false, E::Portable}, {"portable BF16", true, E::Portable}};
  if (cpu::avx512_bf16_usable()) e.push_back({"AVX512_BF16", true, E::Avx512Bf16});
  if (cpu::amx_usable()) e.push_back({"AMX BF16", true, E::Amx});
  return e;
}

// Storage-typed inputs and outputs of one forward + backward call, as doubles.
struct Result {
  std::vector<double> out, lse, dqkv;
};

template <class T>
std::vector<T> store(const Vec& v) {
  std::vector<T> s(v.size());
  for (size_t i = 0; i < v.size(); ++i) s[i] = from_f32<T>(static_cast<float>(v[i]));
  return s;
}
template <class T>
std::vector<double> load(const std::vector<T>& s) {
  std::vector<double> v(s.size());
  for (size_t i = 0; i < s.size(); ++i) v[i] = to_f32(s[i]);
  return v;
}

template <class T>
Result run_typed(const Vec& qkv_in, const Vec& dout_in, Shape s, cpu::AttentionEngine engine, cpu::Workspace& ws) {
  const int64_t N = s.B * s.T, C = s.H * s.D;
  const std::vector<T> qkv = store<T>(qkv_in), dout = store<T>(dout_in);
  std::vector<T> out(N * C), dqkv(N * 3 * C);
  std::vector<float> lse(s.B * s.H * s.T);
  cpu::attention_forward(out.data(), lse.data(), qkv.data(), s.B, s.T, s.H, s.D, engine, ws);
  cpu::attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), s.B, s.T, s.H, s.D, engine, ws);
  return {load(out), std::vector<double>(lse.begin(), lse.end()), load(dqkv)};
}

Result run(const Engine& e, const Vec& qkv, const Vec& dout, Shape s, cpu::Workspace& ws) {
  return e.bf16_storage ? run_typed<bf16>(qkv, dout, s, e.engine, ws) : run_typed<float>(qkv, dout, s, e.engine, ws);
}

// Inputs as the kernel sees them (rounded to its storage type).
Vec rounded(const Vec& v, bool to_bf16_storage) {
  Vec r(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const float f = static_cast<float>(v[i]);
    r[i] = to_bf16_storage ? to_f32(to_bf16(f)) : f;
  }
  return r;
}

// FP64 causal attention and its analytic backward on qkv [B*T, 3C] and dout [B*T, C].
Result reference(const Vec& qkv, const Vec& dout, Shape s) {
  const int64_t T = s.T, D = s.D, C = s.H * D;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  Result r{std::vector<double>(s.B * T * C), std::vector<double>(s.B * s.H * T), std::vector<double>(s.B * T * 3 * C, 0.0)};
  auto at = [&](int64_t b, int64_t t, int64_t part, int64_t h) { return (b * T + t) * 3 * C + part * C + h * D; };
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h)
      for (int64_t i = 0; i < T; ++i) {
        std::vector<double> p(i + 1), dp(i + 1);
        double m = -INFINITY, sum = 0;
        for (int64_t j = 0; j <= i; ++j) {
          double d = 0;
          for (int64_t x = 0; x < D; ++x) d += qkv[at(b, i, 0, h) + x] * qkv[at(b, j, 1, h) + x];
          p[j] = d * scale;
          m = std::max(m, p[j]);
        }
        for (int64_t j = 0; j <= i; ++j) sum += (p[j] = std::exp(p[j] - m));
        for (int64_t j = 0; j <= i; ++j) p[j] /= sum;
        r.lse[(b * s.H + h) * T + i] = m + std::log(sum);
        const double* g = &dout[(b * T + i) * C + h * D];
        double delta = 0;
        for (int64_t j = 0; j <= i; ++j) {
          double d = 0;
          for (int64_t x = 0; x < D; ++x) {
            r.out[(b * T + i) * C + h * D + x] += p[j] * qkv[at(b, j, 2, h) + x];
            d += g[x] * qkv[at(b, j, 2, h) + x];
          }
          dp[j] = d;
          delta += p[j] * d;
        }
        for (int64_t j = 0; j <= i; ++j) {
          const double ds = p[j] * (dp[j] - delta) * scale;
          for (int64_t x = 0; x < D; ++x) {
            r.dqkv[at(b, i, 0, h) + x] += ds * qkv[at(b, j, 1, h) + x];  // dq
            r.dqkv[at(b, j, 1, h) + x] += ds * qkv[at(b, i, 0, h) + x];  // dk
            r.dqkv[at(b, j, 2, h) + x] += p[j] * g[x];                   // dv
          }
        }
      }
  return r;
}

// max |x - ref| / max |ref|
double rel_error(const std::vector<double>& x, const std::vector<double>& ref) {
  double err = 0, mag = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    err = std::max(err, std::abs(x[i] - ref[i]));
    mag = std::max(mag, std::abs(ref[i]));
  }
  return std::isnan(err) ? INFINITY : err / mag;
}

bool same_bits(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!(a[i] == b[i] || (std::isnan(a[i]) && std::isnan(b[i])))) return false;
  return true;
}

const Shape kShapes[] = {{2, 1, 2, 64}, {1, 31, 3, 64}, {2, 32, 1, 64}, {2, 33, 2, 40}, {1, 100, 2, 64}, {1, 70, 1, 5}};

TEST(BlockedAttention, MatchesTheFp64ReferenceOnTileEdges) {
  for (const Engine& e : engines()) {
    double worst_out = 0, worst_lse = 0, worst_grad = 0;
    for (const Shape& s : kShapes) {
      const int64_t N = s.B * s.T, C = s.H * s.D;
      const Vec qkv = random_vec(N * 3 * C, 21, 1.5), dout = random_vec(N * C, 22);
      cpu::Workspace ws;
      const Result got = run(e, qkv, dout, s, ws);
      const Result want = reference(rounded(qkv, e.bf16_storage), rounded(dout, e.bf16_storage), s);
      const double eo = rel_error(got.out, want.out), el = rel_error(got.lse, want.lse), eg = rel_error(got.dqkv, want.dqkv);
      worst_out = std::max(worst_out, eo), worst_lse = std::max(worst_lse, el), worst_grad = std::max(worst_grad, eg);
      // FP32: a few ulps of FP32 over sums of up to 100 terms (measured out 8.8e-7, dqkv 8.0e-7, lse
      // 2.8e-7). BF16: P and dS are rounded to BF16 (2^-9 relative) before their products and the
      // outputs once more (measured out 3.5e-3, dqkv 4.9e-3 on each BF16 engine; lse 8e-8: it is FP32
      // arithmetic on the BF16 inputs).
      const double tol_out = e.bf16_storage ? 1e-2 : 4e-6, tol_grad = e.bf16_storage ? 1.5e-2 : 4e-6, tol_lse = 1.5e-6;
      const std::string where = std::string(e.name) + " B" + std::to_string(s.B) + " T" + std::to_string(s.T) + " H" +
                                std::to_string(s.H) + " D" + std::to_string(s.D);
      EXPECT_LE(eo, tol_out) << where;
      EXPECT_LE(el, tol_lse) << where;
      EXPECT_LE(eg, tol_grad) << where;
      if (s.T == 1) {  // one position attends to itself: the output is v_0 exactly (P = 1)
        const Vec v = rounded(qkv, e.bf16_storage);
        for (int64_t b = 0; b < s.B; ++b)
          for (int64_t x = 0; x < C; ++x) EXPECT_EQ(got.out[b * C + x], v[b * 3 * C + 2 * C + x]) << where;
      }
    }
    if (std::getenv("MULTINORM_TEST_ERRORS"))
      std::printf("[ measured ] attention %s: out %.3g, lse %.3g, dqkv %.3g\n", e.name, worst_out, worst_lse, worst_grad);
  }
}

// Rows past T in the last tile, scratch left by a larger call full of NaN, and a neighbouring
// sequence of NaN must not reach the outputs: the results equal (bit for bit) those of a fresh
// workspace and of the sequence alone.
TEST(BlockedAttention, PaddingStaleScratchAndNeighboursDoNotLeak) {
  const Shape small{1, 33, 2, 40}, large{2, 64, 2, 40};
  const int64_t C = small.H * small.D;
  const Vec qkv = random_vec(small.T * 3 * C, 31), dout = random_vec(small.T * C, 32);
  for (const Engine& e : engines()) {
    cpu::Workspace fresh;
    const Result alone = run(e, qkv, dout, small, fresh);
    cpu::Workspace used;  // first a larger call whose inputs are all NaN
    const Vec nan_qkv(large.B * large.T * 3 * C, std::numeric_limits<double>::quiet_NaN());
    const Vec nan_dout(large.B * large.T * C, std::numeric_limits<double>::quiet_NaN());
    run(e, nan_qkv, nan_dout, large, used);
    const Result after = run(e, qkv, dout, small, used);
    EXPECT_TRUE(same_bits(after.out, alone.out)) << e.name;
    EXPECT_TRUE(same_bits(after.lse, alone.lse)) << e.name;
    EXPECT_TRUE(same_bits(after.dqkv, alone.dqkv)) << e.name;
    // Batch of two: the sequence, then one of NaN.
    const Shape two{2, small.T, small.H, small.D};
    Vec qkv2 = qkv, dout2 = dout;
    qkv2.resize(2 * qkv.size(), std::numeric_limits<double>::quiet_NaN());
    dout2.resize(2 * dout.size(), std::numeric_limits<double>::quiet_NaN());
    cpu::Workspace ws2;
    const Result pair = run(e, qkv2, dout2, two, ws2);
    auto first_half = [](const std::vector<double>& v) { return std::vector<double>(v.begin(), v.begin() + v.size() / 2); };
    EXPECT_TRUE(same_bits(first_half(pair.out), alone.out)) << e.name;
    EXPECT_TRUE(same_bits(first_half(pair.lse), alone.lse)) << e.name;
    EXPECT_TRUE(same_bits(first_half(pair.dqkv), alone.dqkv)) << e.name;
    // The mutation check of this test: the NaN sequence does produce NaN in its own half.
    EXPECT_TRUE(std::isnan(pair.out.back())) << e.name;
  }
}

// Each output row is summed by one thread in a fixed order, so the thread count cannot change a bit.
// B H = 6 heads: up to 3 threads take whole heads (dq summed in the key pass); 4 and 8 threads split
// each head's 4 tiles into 2 and 3 items (the snake deal, a head packed by more than one thread, and
// dq summed by the query pass): the two ways of summing dq must agree bit for bit.
TEST(BlockedAttention, IsBitIdenticalForAnyThreadCount) {
  const Shape s{2, 100, 3, 64};
  const int64_t N = s.B * s.T, C = s.H * s.D;
  const Vec qkv = random_vec(N * 3 * C, 41), dout = random_vec(N * C, 42);
  const int saved = omp_get_max_threads();
  for (const Engine& e : engines()) {
    std::vector<Result> results;
    for (int threads : {1, 2, 3, 4, 8}) {
      omp_set_num_threads(threads);
      cpu::Workspace ws;
      results.push_back(run(e, qkv, dout, s, ws));
    }
    for (size_t i = 1; i < results.size(); ++i) {
      EXPECT_TRUE(same_bits(results[i].out, results[0].out)) << e.name;
      EXPECT_TRUE(same_bits(results[i].dqkv, results[0].dqkv)) << e.name;
      EXPECT_TRUE(same_bits(results[i].lse, results[0].lse)) << e.name;
    }
  }
  omp_set_num_threads(saved);
}

TEST(BlockedAttention, RefusesBf16EnginesForFp32Storage) {
  cpu::Workspace ws;
  float x[3] = {}, lse[1] = {}, out[1] = {};
  for (auto engine : {cpu::AttentionEngine::Amx, cpu::AttentionEngine::Avx512Bf16})
    EXPECT_THROW(cpu::attention_forward(out, lse, x, 1, 1, 1, 1, engine, ws), std::invalid_argument);
}

}  // namespace
