// Optimizers: the fused kernels against naive FP64 references and their mathematical properties;
// Adam against torch.optim.Adam's update written out in FP64; rounding; the schedule; and a short
// training run per optimizer.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "../kernels/common/optim_math.h"
#include "../kernels/common/rounding.h"
#include "../kernels/cpu/cpu_kernels.h"
#include "multinorm/optimizer.h"
#include "multinorm/run_config.h"
#include "multinorm/schedule.h"
#include "test_support.h"

using namespace multinorm;
using namespace multinorm::testing;

namespace {

// Naive SR-Sinkhorn, materialising X (FP64), with norms floored at eps.
Vec sinkgd_reference(const Vec& g, int64_t m, int64_t n, int L, double eps = 1e-8) {
  Vec x = g;
  for (int it = 0; it < L; ++it) {
    for (int64_t i = 0; i < m; ++i) {
      double s = 0;
      for (int64_t j = 0; j < n; ++j) s += x[i * n + j] * x[i * n + j];
      const double f = std::sqrt(double(n)) / std::max(std::sqrt(s), eps);
      for (int64_t j = 0; j < n; ++j) x[i * n + j] *= f;
    }
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t i = 0; i < m; ++i) s += x[i * n + j] * x[i * n + j];
      const double f = std::sqrt(double(m)) / std::max(std::sqrt(s), eps);
      for (int64_t i = 0; i < m; ++i) x[i * n + j] *= f;
    }
  }
  return x;
}

// The update direction a kernel applied: (w0 - w1) / lr.
Vec applied(const Vec& w0, const Vec& w1, double lr) {
  Vec u(w0.size());
  for (size_t i = 0; i < u.size(); ++i) u[i] = (w0[i] - w1[i]) / lr;
  return u;
}

Vec run_sinkgd(Backend& be, const Vec& w0, const Vec& g, int64_t m, int64_t n, int L, DType dt = DType::F32) {
  DeviceBuffer W(be, w0, dt), G(be, g, dt);
  const Vec stored = W.get();  // w0 as the kernel sees it
  SinkGDArgs a;
  a.lr = 0.125f;
  a.iterations = L;
  be.optimizer_kernels().sinkgd_update(W.buf(), G.buf(), m, n, a);
  return applied(stored, W.get(), a.lr);
}

double row_norm(const Vec& x, int64_t n, int64_t i) {
  double s = 0;
  for (int64_t j = 0; j < n; ++j) s += x[i * n + j] * x[i * n + j];
  return std::sqrt(s);
}
double col_norm(const Vec& x, int64_t m, int64_t n, int64_t j) {
  double s = 0;
  for (int64_t i = 0; i < m; ++i) s += x[i * n + j] * x[i * n + j];
  return std::sqrt(s);
}

// FP64 Jacobi eigendecomposition of a symmetric k x k matrix: a reference independent of LAPACK.
void jacobi_eigen(Vec a, int64_t k, Vec& values, Vec& vectors) {
  vectors.assign(k * k, 0.0);
  for (int64_t i = 0; i < k; ++i) vectors[i * k + i] = 1.0;
  for (int sweep = 0; sweep < 100; ++sweep) {
    double off = 0;
    for (int64_t p = 0; p < k; ++p)
      for (int64_t q = p + 1; q < k; ++q) off += a[p * k + q] * a[p * k + q];
    if (off < 1e-26) break;
    for (int64_t p = 0; p < k; ++p)
      for (int64_t q = p + 1; q < k; ++q) {
        if (std::fabs(a[p * k + q]) < 1e-300) continue;
        const double theta = (a[q * k + q] - a[p * k + p]) / (2 * a[p * k + q]);
        const double t = (theta >= 0 ? 1 : -1) / (std::fabs(theta) + std::sqrt(theta * theta + 1));
        const double c = 1 / std::sqrt(t * t + 1), s = t * c;
        for (int64_t r = 0; r < k; ++r) {  // A <- A J (columns p, q)
          const double ap = a[r * k + p], aq = a[r * k + q];
          a[r * k + p] = c * ap - s * aq;
          a[r * k + q] = s * ap + c * aq;
        }
        for (int64_t r = 0; r < k; ++r) {  // A <- J^T A (rows p, q)
          const double ap = a[p * k + r], aq = a[q * k + r];
          a[p * k + r] = c * ap - s * aq;
          a[q * k + r] = s * ap + c * aq;
        }
        for (int64_t r = 0; r < k; ++r) {
          const double vp = vectors[r * k + p], vq = vectors[r * k + q];
          vectors[r * k + p] = c * vp - s * vq;
          vectors[r * k + q] = s * vp + c * vq;
        }
      }
  }
  values.resize(k);
  for (int64_t i = 0; i < k; ++i) values[i] = a[i * k + i];
}

Vec transpose(const Vec& x, int64_t m, int64_t n);

// sqrt(n) x the polar factor of x [m, n], m <= n: sqrt(n) (x x^T)^(-1/2) x, by Jacobi (FP64).
Vec polar_reference(const Vec& x, int64_t m, int64_t n, double scale) {
  Vec a(m * m, 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t l = 0; l < m; ++l)
      for (int64_t j = 0; j < n; ++j) a[i * m + l] += x[i * n + j] * x[l * n + j];
  Vec lam, q;
  jacobi_eigen(a, m, lam, q);
  Vec inv(m * m, 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t l = 0; l < m; ++l)
      for (int64_t e = 0; e < m; ++e) inv[i * m + l] += q[i * m + e] * q[l * m + e] / std::sqrt(lam[e]);
  Vec u(m * n, 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t l = 0; l < m; ++l)
      for (int64_t j = 0; j < n; ++j) u[i * n + j] += scale * inv[i * m + l] * x[l * n + j];
  return u;
}

// SWAN's update direction in FP64: X = sqrt(n) rownorm(G), U = sqrt(max(m, n)) polar(X), so that
// ||U||_F = sqrt(mn) in either orientation; a tall X's polar factor is the transpose of its
// transpose's.
Vec swan_reference(const Vec& g, int64_t m, int64_t n) {
  Vec x(m * n);
  for (int64_t i = 0; i < m; ++i) {
    const double f = std::sqrt(double(n)) / row_norm(g, n, i);
    for (int64_t j = 0; j < n; ++j) x[i * n + j] = g[i * n + j] * f;
  }
  const double scale = std::sqrt(double(std::max(m, n)));
  if (m <= n) return polar_reference(x, m, n, scale);
  return transpose(polar_reference(transpose(x, m, n), n, m, scale), n, m);
}

// max |U U^T - max(m,n) I| (U^T U when tall) / max(m,n): how far U is from whitened.
double whitening_deviation(const Vec& u, int64_t m, int64_t n) {
  const bool wide = m <= n;
  const int64_t k = wide ? m : n;
  double worst = 0;
  for (int64_t a = 0; a < k; ++a)
    for (int64_t b = 0; b < k; ++b) {
      double dot = 0;
      if (wide) for (int64_t j = 0; j < n; ++j) dot += u[a * n + j] * u[b * n + j];
      else for (int64_t i = 0; i < m; ++i) dot += u[i * n + a] * u[i * n + b];
      worst = std::max(worst, std::fabs(dot - (a == b ? double(std::max(m, n)) : 0.0)));
    }
  return worst / double(std::max(m, n));
}

Vec transpose(const Vec& x, int64_t m, int64_t n) {
  Vec t(m * n);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) t[j * m + i] = x[i * n + j];
  return t;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// SinkGD
// ---------------------------------------------------------------------------------------------

TEST(SinkGD, FusedEqualsTheMaterialisedReference) {
  auto be = make_cpu_backend(2);
  struct Shape { int64_t m, n; };
  for (Shape s : {Shape{13, 17}, Shape{29, 7}, Shape{1, 19}, Shape{23, 1}, Shape{130, 70}}) {
    for (int L : {1, 5}) {
      const Vec g = random_vec(s.m * s.n, 21), w0 = random_vec(s.m * s.n, 22);
      EXPECT_TRUE(close(run_sinkgd(*be, w0, g, s.m, s.n, L), sinkgd_reference(g, s.m, s.n, L), 2e-5))
          << s.m << "x" << s.n << " L=" << L;
    }
  }
}

TEST(SinkGD, ColumnsEndAtSqrtMAndRowsConvergeToSqrtN) {
  auto be = make_cpu_backend(2);
  const int64_t m = 48, n = 80;
  const Vec g = random_vec(m * n, 23), w0(m * n, 0.0);
  std::vector<double> worst;
  for (int L : {1, 2, 4, 30}) {
    const Vec x = run_sinkgd(*be, w0, g, m, n, L);
    for (int64_t j = 0; j < n; ++j) EXPECT_NEAR(col_norm(x, m, n, j), std::sqrt(double(m)), 1e-4);
    double w = 0;
    for (int64_t i = 0; i < m; ++i) w = std::max(w, std::fabs(row_norm(x, n, i) - std::sqrt(double(n))));
    worst.push_back(w);
  }
  // Row norms approach sqrt(n) as L grows, down to FP32 round-off at the fixed point.
  EXPECT_LT(worst[1], worst[0]);
  EXPECT_LT(worst[2], worst[1]);
  EXPECT_GT(worst[0], 1e-2 * std::sqrt(double(n)));  // one iteration is visibly not converged
  EXPECT_LT(worst[3], 1e-5 * std::sqrt(double(n)));
}

TEST(SinkGD, ZeroRowsAndColumnsGiveZeroUpdatesNeverNaN) {
  auto be = make_cpu_backend(2);
  const int64_t m = 16, n = 12;
  Vec g = random_vec(m * n, 24);
  for (int64_t j = 0; j < n; ++j) g[3 * n + j] = 0;
  for (int64_t i = 0; i < m; ++i) g[i * n + 5] = 0;
  const Vec x = run_sinkgd(*be, random_vec(m * n, 25), g, m, n, 5);
  for (double v : x) ASSERT_TRUE(std::isfinite(v));
  for (int64_t j = 0; j < n; ++j) EXPECT_EQ(x[3 * n + j], 0.0);
  for (int64_t i = 0; i < m; ++i) EXPECT_EQ(x[i * n + 5], 0.0);
  EXPECT_TRUE(close(x, sinkgd_reference(g, m, n, 5), 2e-5));
  const Vec zero = run_sinkgd(*be, Vec(m * n, 1.0), Vec(m * n, 0.0), m, n, 5);  // all-zero gradient
  for (double v : zero) EXPECT_EQ(v, 0.0);
}

TEST(SinkGD, Bf16WeightsAndThreadIndependence) {
  const int64_t m = 70, n = 90;
  const Vec g = random_vec(m * n, 26), w0 = random_vec(m * n, 27);
  auto one = make_cpu_backend(1);
  const Vec a = run_sinkgd(*one, w0, g, m, n, 5);
  auto two = make_cpu_backend(2);
  const Vec b = run_sinkgd(*two, w0, g, m, n, 5);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(double)), 0) << "result depends on the thread count";
  // BF16 storage: the update is computed in FP32 from the BF16 gradient and rounded once.
  DeviceBuffer W(*two, w0, DType::BF16), G(*two, g, DType::BF16);
  const Vec w_stored = W.get(), g_stored = G.get();
  SinkGDArgs args;
  args.lr = 0.125f;
  two->optimizer_kernels().sinkgd_update(W.buf(), G.buf(), m, n, args);
  const Vec ref = sinkgd_reference(g_stored, m, n, 5);
  Vec expect(m * n);
  for (int64_t i = 0; i < m * n; ++i) expect[i] = w_stored[i] - 0.125 * ref[i];
  EXPECT_TRUE(close(W.get(), expect, 1.0 / 128));  // one BF16 rounding (2^-8 relative) of each weight
}

// A BF16 gradient is widened to FP32 either once into a cache that the L passes and the W write read
// (where it fits L2) or afresh each pass into a row buffer; the two must agree to the bit, on shapes
// with partial row groups (m mod 4), partial chunks and partial 64-lane blocks (n mod 64) or none
// (the AVX-512 row group then adds its trees in registers), and with a zero row and column. Both must
// also be the FP64 reference's update within one BF16 rounding. The streamed rows' sums come from
// row_group_sum_store on every pass, the cached ones' from row_sums after the first: where AVX-512 is
// compiled in, that compares its row groups with the portable loops. (Mutation checks: squaring in
// another order in one of the two row-sum loops, or adding the register tree as (0 + 1) + (2 + 3),
// fails the FP32 compare.)
TEST(SinkGD, CachedAndStreamedBf16RowsGiveTheSameBits) {
  struct Shape { int64_t m, n; };
  for (Shape s : {Shape{1, 1}, Shape{3, 70}, Shape{37, 129}, Shape{130, 65}, Shape{261, 200}, Shape{29, 100}, Shape{33, 32},
                  Shape{66, 128}, Shape{9, 64}}) {
    Vec g = random_vec(s.m * s.n, 31, 1e-3), w0 = random_vec(s.m * s.n, 32, 0.05);
    if (s.m > 2 && s.n > 2) {
      for (int64_t j = 0; j < s.n; ++j) g[1 * s.n + j] = 0;
      for (int64_t i = 0; i < s.m; ++i) g[i * s.n + 2] = 0;
    }
    std::vector<bf16> gb(g.size()), wb(w0.size());
    for (size_t i = 0; i < g.size(); ++i) gb[i] = to_bf16(float(g[i])), wb[i] = to_bf16(float(w0[i]));
    SinkGDArgs a;
    a.lr = 0.125f;
    a.iterations = 5;
    cpu::Workspace ws;
    std::vector<bf16> cached = wb, streamed = wb;
    cpu::sinkgd_update(cached.data(), gb.data(), s.m, s.n, a, ws, cpu::SinkgdRows::kCached);
    cpu::sinkgd_update(streamed.data(), gb.data(), s.m, s.n, a, ws, cpu::SinkgdRows::kStreamed);
    ASSERT_EQ(std::memcmp(cached.data(), streamed.data(), cached.size() * sizeof(bf16)), 0) << s.m << "x" << s.n;
    // FP32 weights show the update's every bit (a BF16 weight would hide a last-bit difference).
    std::vector<float> wide_cached(g.size(), 0.0f), wide_streamed(g.size(), 0.0f);
    cpu::sinkgd_update(wide_cached.data(), gb.data(), s.m, s.n, a, ws, cpu::SinkgdRows::kCached);
    cpu::sinkgd_update(wide_streamed.data(), gb.data(), s.m, s.n, a, ws, cpu::SinkgdRows::kStreamed);
    ASSERT_EQ(std::memcmp(wide_cached.data(), wide_streamed.data(), g.size() * sizeof(float)), 0) << s.m << "x" << s.n;
    Vec g_stored(g.size()), w_got(g.size()), expect(g.size());
    for (size_t i = 0; i < g.size(); ++i) g_stored[i] = to_f32(gb[i]), w_got[i] = to_f32(cached[i]);
    const Vec ref = sinkgd_reference(g_stored, s.m, s.n, 5);
    for (size_t i = 0; i < g.size(); ++i) expect[i] = to_f32(wb[i]) - 0.125 * ref[i];
    EXPECT_TRUE(close(w_got, expect, 1.0 / 128)) << s.m << "x" << s.n;  // one BF16 rounding of each weight
  }
}

// Which tensors sinkgd_update_many runs whole on one core: within the byte budget, and either within
// a core's L2 or no more than a fair share of the call's elements, so a lone large tensor keeps every
// core busy. A 64 MB BF16 G (past any core's L2), budget 1 TB: one core only with company.
TEST(SinkGD, OneCoreTensorsFitTheBudgetAndAFairShare) {
  constexpr int64_t m = 4096, n = 8192, kTiB = int64_t{1} << 40;
  EXPECT_FALSE(cpu::sinkgd_runs_one_core(m, n, 2, m * n, 2, kTiB));     // alone, two threads
  EXPECT_TRUE(cpu::sinkgd_runs_one_core(m, n, 2, m * n, 1, kTiB));      // alone, one thread
  EXPECT_TRUE(cpu::sinkgd_runs_one_core(m, n, 2, 2 * m * n, 2, kTiB));  // half of the work
  EXPECT_FALSE(cpu::sinkgd_runs_one_core(m, n, 2, 2 * m * n, 3, kTiB));
  EXPECT_FALSE(cpu::sinkgd_runs_one_core(m, n, 2, 8 * m * n, 2, m * n));  // over the byte budget
  EXPECT_TRUE(cpu::sinkgd_runs_one_core(8, 8, 2, 1 << 30, 64, kTiB));     // within L2: always
}

// sinkgd_update_many runs each tensor whose gradient fits a core's cache budget whole on one core,
// and the others row-split over all cores; either way each tensor's update must equal
// sinkgd_update's to the bit: FP32 weights (every bit of the update shows), BF16 weights and
// gradients, BF16 weights with FP32 gradients; stochastic rounding (each tensor's own id); one and
// two threads; partial row groups (m mod 4), chunks and 64-lane blocks (n mod 64), a zero row, and
// one tensor over the budget (given small here: the default is megabytes). (Mutation check: adding
// every chunk's column sums straight into v in the one-core kernel, instead of a chunk at a time,
// fails the FP32 compare.)
TEST(SinkGD, ManyTensorsEqualOneByOne) {
  struct Shape { int64_t m, n; };
  constexpr int64_t kOneCoreBytes = 256 << 10;  // 300 x 512 BF16 (300 KB) goes row-split
  const std::vector<Shape> shapes = {{1, 1}, {3, 70}, {37, 129}, {130, 65}, {300, 512}, {261, 200}, {64, 64}, {29, 100}, {33, 32}};
  int64_t total = 0;
  for (Shape s : shapes) total += s.m * s.n;
  int fitting = 0;
  for (Shape s : shapes) fitting += cpu::sinkgd_runs_one_core(s.m, s.n, 2, total, 2, kOneCoreBytes);
  ASSERT_EQ(fitting, static_cast<int>(shapes.size()) - 1) << "both paths must be exercised";
  struct Types { DType w, g; };
  for (int threads : {1, 2})
    for (Types t : {Types{DType::F32, DType::F32}, Types{DType::BF16, DType::BF16}, Types{DType::BF16, DType::F32}})
      for (bool stochastic : {false, true}) {
        auto be = make_cpu_backend(threads);
        SinkGDArgs a;
        a.lr = 0.125f;
        a.decoupled_decay = 0.1f;
        a.iterations = 5;
        a.write = {stochastic, 7, 3, 0};
        std::vector<std::unique_ptr<DeviceBuffer>> many, one, grads;
        std::vector<SinkGDTensor> tensors;
        std::vector<Vec> stored;  // the weights before the update, as stored
        for (size_t k = 0; k < shapes.size(); ++k) {
          const Shape s = shapes[k];
          Vec g = random_vec(s.m * s.n, 40 + k, 1e-3);
          if (s.m > 2)
            for (int64_t j = 0; j < s.n; ++j) g[1 * s.n + j] = 0;
          const Vec w0 = random_vec(s.m * s.n, 60 + k, 0.05);
          grads.push_back(std::make_unique<DeviceBuffer>(*be, g, t.g));
          many.push_back(std::make_unique<DeviceBuffer>(*be, w0, t.w));
          one.push_back(std::make_unique<DeviceBuffer>(*be, w0, t.w));
          stored.push_back(one.back()->get());
          SinkGDArgs ak = a;
          ak.write.tensor = 100 + k;
          be->optimizer_kernels().sinkgd_update(one.back()->buf(), grads.back()->buf(), s.m, s.n, ak);
          tensors.push_back({many.back()->buf(), grads.back()->buf(), s.m, s.n, 100 + k});
        }
        cpu::Workspace ws;  // the backend's kernel, with the small budget (the backend set the threads)
        cpu::sinkgd_update_many(tensors.data(), static_cast<int64_t>(tensors.size()), a, ws, kOneCoreBytes);
        for (size_t k = 0; k < shapes.size(); ++k) {
          const Vec x = many[k]->get(), y = one[k]->get();
          EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size() * sizeof(double)), 0)
              << shapes[k].m << "x" << shapes[k].n << " " << dtype_name(t.w) << "/" << dtype_name(t.g) << " threads "
              << threads << (stochastic ? " stochastic" : "");
          EXPECT_NE(x, stored[k]) << shapes[k].m << "x" << shapes[k].n;  // an update was applied
        }
      }
}

// A BF16 weight's update is computed in registers and rounded there (write_bf16_row, where the build
// has AVX512-BF16); it must be to_bf16 of the FP32 weight that the same kernel writes from the same
// stored weights: round to nearest even, and denormal results rounded, not flushed to zero
// (VCVTNE2PS2BF16 flushes them). Row 1 of G is zero, so its weights become keep w, and those are
// given denormal values. Both kernels (one-core, row-split), BF16 and FP32 gradients, widths with
// and without a tail after the last 32 columns. (Mutation checks: rounding by truncation, or dropping
// the denormal fallback, fails the compare.)
TEST(SinkGD, Bf16WeightsAreTheFp32UpdateRoundedOnce) {
  struct Shape { int64_t m, n; };
  for (Shape s : {Shape{37, 129}, Shape{64, 64}, Shape{33, 32}, Shape{9, 1376}, Shape{130, 65}})
    for (DType gt : {DType::BF16, DType::F32})
      for (int64_t one_core_bytes : {int64_t{1} << 30, int64_t{1}}) {  // one core; row-split
        Vec g = random_vec(s.m * s.n, 70, 1e-3), w0 = random_vec(s.m * s.n, 71, 0.05);
        for (int64_t j = 0; j < s.n; ++j) g[1 * s.n + j] = 0, w0[1 * s.n + j] = (j % 2 ? -1 : 1) * 1e-39 * (1 + j % 7);
        std::vector<bf16> wb(w0.size()), gb(g.size());
        std::vector<float> wf(w0.size()), gf(g.size());
        for (size_t i = 0; i < g.size(); ++i) {
          wb[i] = to_bf16(float(w0[i])), gb[i] = to_bf16(float(g[i]));
          wf[i] = to_f32(wb[i]), gf[i] = to_f32(gb[i]);  // the same values, stored in FP32
        }
        ASSERT_EQ(std::fpclassify(wf[s.n]), FP_SUBNORMAL);
        void* grad = gt == DType::BF16 ? static_cast<void*>(gb.data()) : gf.data();
        SinkGDArgs a;
        a.lr = 0.125f;
        a.decoupled_decay = 0.5f;
        a.iterations = 5;
        cpu::Workspace ws;
        SinkGDTensor t16{{wb.data(), DType::BF16}, {grad, gt}, s.m, s.n, 0};
        cpu::sinkgd_update_many(&t16, 1, a, ws, one_core_bytes);
        std::vector<float> wide = wf;  // the FP32 update, row-split (the same bits as one core: above)
        if (gt == DType::BF16) cpu::sinkgd_update(wide.data(), gb.data(), s.m, s.n, a, ws);
        else cpu::sinkgd_update(wide.data(), gf.data(), s.m, s.n, a, ws);
        int64_t differ = 0, denormal = 0;
        for (size_t i = 0; i < wide.size(); ++i) {
          differ += wb[i].bits != to_bf16(wide[i]).bits;
          denormal += std::fpclassify(to_f32(wb[i])) == FP_SUBNORMAL;
        }
        EXPECT_EQ(differ, 0) << s.m << "x" << s.n << " " << dtype_name(gt) << (one_core_bytes > 1 ? " one core" : " row-split");
        EXPECT_GT(denormal, s.n / 2) << "the zero row's weights stay denormal (keep w)";
      }
}

// ---------------------------------------------------------------------------------------------
// SWAN
// ---------------------------------------------------------------------------------------------

Vec run_swan(Backend& be, const Vec& g, int64_t m, int64_t n, bool exact, int ns_steps, bool standardize = false) {
  const Vec w0(m * n, 0.0);
  DeviceBuffer W(be, w0, DType::F32), G(be, g, DType::F32);
  SwanArgs a;
  a.lr = 0.5f;
  a.exact = exact;
  a.ns_steps = ns_steps;
  a.standardize = standardize;
  be.optimizer_kernels().swan_update(W.buf(), G.buf(), m, n, a);
  return applied(w0, W.get(), a.lr);
}

TEST(Swan, WhitensRowsToNTimesIdentity) {
  auto be = make_cpu_backend(2);
  struct Shape { int64_t m, n; };
  for (Shape s : {Shape{24, 40}, Shape{32, 32}, Shape{40, 24}}) {
    // A well-conditioned matrix (singular values within ~1:20): FP32 Newton-Schulz whitens it.
    // Directions with eigenvalues below ~1e-6 of the largest are FP32 noise in the Gram matrix,
    // which only the exact FP64 path resolves (docs/optimizers.md).
    Vec g = random_vec(s.m * s.n, 31, 0.5);
    for (int64_t i = 0; i < std::min(s.m, s.n); ++i) g[i * s.n + i] += 6.0;
    for (bool exact : {false, true}) {
      const Vec u = run_swan(*be, g, s.m, s.n, exact, 30);
      // Wide: U U^T = n I. Tall (computed on the transpose): U^T U = m I. Either way ||U||_F^2 = mn.
      // Stated tolerance: 1e-3 (Newton-Schulz, 30 steps) and 1e-4 (exact FP64 path, FP32 output).
      EXPECT_LT(whitening_deviation(u, s.m, s.n), exact ? 1e-4 : 1e-3)
          << s.m << "x" << s.n << (exact ? " exact" : " newton-schulz");
    }
  }
}

TEST(Swan, MatchesTheEigendecompositionReference) {
  auto be = make_cpu_backend(2);
  const int64_t m = 12, n = 20;
  const Vec g = random_vec(m * n, 32);
  const Vec ref = swan_reference(g, m, n);
  EXPECT_TRUE(close(run_swan(*be, g, m, n, true, 0), ref, 1e-5));
  EXPECT_TRUE(close(run_swan(*be, g, m, n, false, 40), ref, 1e-3));
  // Tall (20 x 12): the same polar factor, computed through the 12 x 12 Gram matrix X^T X.
  const Vec gt = random_vec(n * m, 33);
  EXPECT_TRUE(close(run_swan(*be, gt, n, m, true, 0), swan_reference(gt, n, m), 1e-5));
  EXPECT_TRUE(close(run_swan(*be, gt, n, m, false, 40), swan_reference(gt, n, m), 1e-3));
}

// The paper's scaling: ||U||_F = sqrt(mn) for wide, square and tall (gate/up: 688 x 256 in
// llama_tiny) matrices, on both paths.
TEST(Swan, UpdateHasFrobeniusNormSqrtMN) {
  auto be = make_cpu_backend(2);
  struct Shape { int64_t m, n; };
  for (Shape s : {Shape{16, 40}, Shape{24, 24}, Shape{43, 16}, Shape{86, 32}}) {
    const Vec g = random_vec(s.m * s.n, 37);
    const Vec ref = swan_reference(g, s.m, s.n);
    for (bool exact : {true, false}) {
      const Vec u = run_swan(*be, g, s.m, s.n, exact, 30);
      double f2 = 0;
      for (double v : u) f2 += v * v;
      // Measured relative error: <= 3.5e-8 (exact), <= 5.1e-5 (Newton-Schulz, 24 x 24 the worst).
      EXPECT_NEAR(std::sqrt(f2) / std::sqrt(double(s.m * s.n)), 1.0, exact ? 1e-6 : 2e-4)
          << s.m << "x" << s.n << (exact ? " exact" : " newton-schulz");
      EXPECT_TRUE(close(u, ref, exact ? 1e-5 : 1e-3)) << s.m << "x" << s.n << (exact ? " exact" : " newton-schulz");
    }
  }
}

// G = Q1 diag(s) Q2^T with singular values spread over 1 .. 1e-5 (the v and o projections at
// initialisation have most of theirs below 1e-3 of the largest).
Vec ill_conditioned(int64_t m, int64_t n, double smallest, uint32_t seed) {
  auto orthonormal_columns = [](int64_t rows, int64_t cols, uint32_t s) {  // Gram-Schmidt, twice
    Vec q = random_vec(rows * cols, s);
    for (int pass = 0; pass < 2; ++pass)
      for (int64_t j = 0; j < cols; ++j) {
        for (int64_t p = 0; p < j; ++p) {
          double d = 0;
          for (int64_t i = 0; i < rows; ++i) d += q[i * cols + j] * q[i * cols + p];
          for (int64_t i = 0; i < rows; ++i) q[i * cols + j] -= d * q[i * cols + p];
        }
        double nn = 0;
        for (int64_t i = 0; i < rows; ++i) nn += q[i * cols + j] * q[i * cols + j];
        for (int64_t i = 0; i < rows; ++i) q[i * cols + j] /= std::sqrt(nn);
      }
    return q;
  };
  const int64_t k = std::min(m, n);
  const Vec a = orthonormal_columns(m, k, seed), b = orthonormal_columns(n, k, seed + 1);
  Vec g(m * n, 0.0);
  for (int64_t r = 0; r < k; ++r) {
    const double s = std::pow(smallest, double(r) / double(k - 1));
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) g[i * n + j] += s * a[i * k + r] * b[j * k + r];
  }
  return g;
}

TEST(Swan, ExactPathIsExactOnIllConditionedGradients) {
  auto be = make_cpu_backend(2);
  struct Shape { int64_t m, n; };
  for (Shape s : {Shape{24, 40}, Shape{40, 24}}) {
    const Vec g = ill_conditioned(s.m, s.n, 1e-5, 38);
    const Vec u = run_swan(*be, g, s.m, s.n, true, 0);
    // Whitened: U U^T = max(m,n) I (U^T U when tall), which input rounding cannot disturb. With an
    // FP32 Gram matrix, the directions below ~3e-4 are noise and this is off by orders of magnitude.
    // Measured worst deviation: 1.4e-7 max(m,n) (the FP32 output's rounding); asserted 2e-6.
    EXPECT_LT(whitening_deviation(u, s.m, s.n), 2e-6) << s.m << "x" << s.n;
    // The FP32 Newton-Schulz path (FP32 Gram matrix) cannot resolve these directions: documented
    // limit, measured here so the docs stay true.
    const double ns = whitening_deviation(run_swan(*be, g, s.m, s.n, false, 100), s.m, s.n);
    std::printf("%lldx%lld deviation: exact %.2g, newton-schulz %.2g\n", (long long)s.m, (long long)s.n, whitening_deviation(u, s.m, s.n), ns);
    EXPECT_GT(ns, 1e-3) << s.m << "x" << s.n;
    // Equal to the independent FP64 reference (Jacobi on an FP64 Gram matrix) up to what the FP32
    // gradient itself allows: the polar factor amplifies an input perturbation e by up to
    // 1 / sigma_min, here 6e-8 / 1e-5. Measured 2e-4 of the scale; asserted 2e-3.
    EXPECT_TRUE(close(u, swan_reference(g, s.m, s.n), 2e-3)) << s.m << "x" << s.n;
  }
}

TEST(Swan, NewtonSchulzReportsItsResidualNeverSilently) {
  auto be = make_cpu_backend(2);
  const int64_t m = 24, n = 40;
  auto run = [&](const Vec& g, int steps) {
    DeviceBuffer W(*be, Vec(m * n, 0.0), DType::F32), G(*be, g, DType::F32);
    SwanArgs a;
    a.lr = 0.5f;
    a.ns_steps = steps;
    a.ns_tolerance = 1e-4f;
    SwanStats stats;
    a.stats = &stats;  // host memory: the CPU backend's
    be->optimizer_kernels().swan_update(W.buf(), G.buf(), m, n, a);
    return stats;
  };
  Vec good = random_vec(m * n, 39, 0.5);
  for (int64_t i = 0; i < m; ++i) good[i * n + i] += 6.0;
  const SwanStats ok = run(good, 30);
  EXPECT_EQ(ok.tensors, 1u);
  EXPECT_EQ(ok.unconverged, 0u);
  EXPECT_GT(ok.steps, 3u);   // it converged, in fewer than all 30 steps
  EXPECT_LT(ok.steps, 30u);
  EXPECT_LT(ok.worst_residual, 1e-4);
  EXPECT_GT(ok.worst_residual, 0.0);  // measured, not assumed
  // Three steps cannot whiten singular values spread over 1e3: reported, with the residual.
  const SwanStats bad = run(ill_conditioned(m, n, 1e-3, 40), 3);
  EXPECT_EQ(bad.unconverged, 1u);
  EXPECT_EQ(bad.steps, 3u);
  EXPECT_GT(bad.worst_residual, 1e-2);
}

// The scaled Newton-Schulz steps (optim_math::ns_step) reach the tolerance within the bound their
// schedule gives (ns_steps_bound: 10 at 1e-4), whatever the spectrum: a diagonally dominant gradient,
// singular values spread over 1e-3 and 1e-5, a rank-3 one, a square Gaussian one (its smallest
// singular value near 0), wide and tall. The plain iteration (T = (3I - P) / 2) needs 17-21 on the
// spread ones, over the bound (mutation check: alpha = 1 fails here).
TEST(Swan, ScaledNewtonSchulzConvergesWithinItsBound) {
  auto be = make_cpu_backend(2);
  const int bound = optim_math::ns_steps_bound(1e-4);
  EXPECT_EQ(bound, 10);
  // The default ceiling (a run config's, and the struct's) leaves FP32 rounding two steps past the
  // bound of the default tolerance.
  const SwanConfig defaults;
  EXPECT_EQ(defaults.ns_steps, optim_math::ns_steps_bound(defaults.ns_tolerance) + 2);
  const RunConfig parsed = run_config_from_json(json::parse(R"({"model": {"config": {"vocab_size": 101, "hidden_size": 32,
      "intermediate_size": 40, "num_hidden_layers": 1, "num_attention_heads": 2, "max_position_embeddings": 256}}})"), "test");
  EXPECT_EQ(parsed.optimizer.swan.ns_steps, defaults.ns_steps);
  EXPECT_EQ(parsed.optimizer.swan.ns_tolerance, defaults.ns_tolerance);
  struct Case {
    const char* name;
    int64_t m, n;
    Vec g;
  };
  Vec dominant = random_vec(24 * 40, 39, 0.5), rank3(16 * 32, 0.0);
  for (int64_t i = 0; i < 24; ++i) dominant[i * 40 + i] += 6.0;
  const Vec a = random_vec(16 * 3, 34), b = random_vec(3 * 32, 35);
  for (int64_t i = 0; i < 16; ++i)
    for (int64_t j = 0; j < 32; ++j)
      for (int64_t r = 0; r < 3; ++r) rank3[i * 32 + j] += a[i * 3 + r] * b[r * 32 + j];
  const Case cases[] = {{"dominant", 24, 40, dominant},
                        {"spread 1e-3", 24, 40, ill_conditioned(24, 40, 1e-3, 40)},
                        {"spread 1e-5 tall", 40, 24, ill_conditioned(40, 24, 1e-5, 38)},
                        {"rank 3", 16, 32, rank3},
                        {"square gaussian", 48, 48, random_vec(48 * 48, 41)}};
  for (const Case& c : cases) {
    DeviceBuffer W(*be, Vec(c.m * c.n, 0.0), DType::F32), G(*be, c.g, DType::F32);
    SwanArgs args;
    args.lr = 0.5f, args.ns_steps = 30, args.ns_tolerance = 1e-4f;
    SwanStats stats;
    args.stats = &stats;
    be->optimizer_kernels().swan_update(W.buf(), G.buf(), c.m, c.n, args);
    EXPECT_EQ(stats.unconverged, 0u) << c.name;
    EXPECT_EQ(stats.fallbacks, 0u) << c.name;
    EXPECT_LE(stats.steps, static_cast<uint32_t>(bound)) << c.name;
    EXPECT_LT(stats.worst_residual, 1e-4) << c.name;
  }
}

// The residual ||I - ZY|| the convergence test reads cannot see an error in Z itself: the scaled
// iteration's U against the exact FP64 polar factor on gradients whose singular values spread over
// 1e-1 and 1e-2, wide and tall, relative Frobenius error. Bounds 1e-4 (measured 3.0e-5) and 5e-3
// (measured 1.9e-3: the regularisation, 1e-6 ||A||_F, moves the smallest eigenvalues, 1e-4 of the
// largest, by ~1%); the plain iteration measures the same, 3.1e-5 and 1.9e-3.
TEST(Swan, ScaledNewtonSchulzMatchesTheExactPolarFactorOnSpreadSpectra) {
  auto be = make_cpu_backend(2);
  for (const double smallest : {1e-1, 1e-2})
    for (const auto& [m, n] : {std::pair<int64_t, int64_t>{24, 40}, {40, 24}}) {
      const Vec g = ill_conditioned(m, n, smallest, 42);
      const Vec ns = run_swan(*be, g, m, n, false, 30), exact = run_swan(*be, g, m, n, true, 0);
      double d2 = 0, e2 = 0;
      for (size_t i = 0; i < ns.size(); ++i) d2 += (ns[i] - exact[i]) * (ns[i] - exact[i]), e2 += exact[i] * exact[i];
      EXPECT_LT(std::sqrt(d2 / e2), smallest > 0.05 ? 1e-4 : 5e-3) << "spread " << smallest << ", " << m << "x" << n;
    }
}

TEST(Swan, RankDeficientGradientsStayFinite) {
  auto be = make_cpu_backend(2);
  const int64_t m = 16, n = 32, r = 3;
  const Vec a = random_vec(m * r, 34), b = random_vec(r * n, 35);
  Vec g(m * n, 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t k = 0; k < r; ++k) g[i * n + j] += a[i * r + k] * b[k * n + j];
  for (bool exact : {false, true})
    for (double v : run_swan(*be, g, m, n, exact, 30)) ASSERT_TRUE(std::isfinite(v)) << (exact ? "exact" : "ns");
  // Standardised rows (the SWAN paper's GradNorm) too.
  for (double v : run_swan(*be, random_vec(m * n, 36), m, n, false, 30, true)) ASSERT_TRUE(std::isfinite(v));
}

// ---------------------------------------------------------------------------------------------
// Adam, SGD, rounding
// ---------------------------------------------------------------------------------------------

TEST(Adam, MatchesTorchAdamTrajectory) {
  auto be = make_cpu_backend(2);
  const int64_t n = 37;
  for (bool adamw : {false, true}) {
    const Vec w0 = random_vec(n, 41);
    DeviceBuffer W(*be, w0, DType::F32), M(*be, n, DType::F32), V(*be, n, DType::F32);
    Vec w = w0, m(n, 0.0), v(n, 0.0);
    const double lr = 1e-2, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.1;
    for (int t = 1; t <= 6; ++t) {
      const Vec g = random_vec(n, 100 + t, 0.1 * t);
      DeviceBuffer G(*be, g, DType::F32);
      AdamArgs a;
      a.lr = static_cast<float>(lr);
      (adamw ? a.decoupled_decay : a.l2_decay) = static_cast<float>(wd);
      a.step = t;
      be->optimizer_kernels().adam_update(W.buf(), G.buf(), M.buf(), V.buf(), n, a);
      for (int64_t i = 0; i < n; ++i) {  // torch.optim.Adam / AdamW, written out
        double gi = g[i];
        if (adamw) w[i] *= 1 - lr * wd;
        else gi += wd * w[i];
        m[i] = b1 * m[i] + (1 - b1) * gi;
        v[i] = b2 * v[i] + (1 - b2) * gi * gi;
        const double mh = m[i] / (1 - std::pow(b1, t)), vh = v[i] / (1 - std::pow(b2, t));
        w[i] -= lr * mh / (std::sqrt(vh) + eps);
      }
      EXPECT_TRUE(close(W.get(), w, 1e-6)) << (adamw ? "adamw" : "adam") << " step " << t;
      EXPECT_TRUE(close(M.get(), m, 1e-6));
      EXPECT_TRUE(close(V.get(), v, 1e-5));
    }
  }
}

TEST(Adam, Bf16StatesStayWithinTheirRounding) {
  auto be = make_cpu_backend(2);
  const int64_t n = 4096;
  const Vec w0 = random_vec(n, 42);
  DeviceBuffer W32(*be, w0, DType::F32), M32(*be, n, DType::F32), V32(*be, n, DType::F32);
  DeviceBuffer W16(*be, w0, DType::F32), M16(*be, n, DType::BF16), V16(*be, n, DType::BF16);
  for (int t = 1; t <= 10; ++t) {
    DeviceBuffer G(*be, random_vec(n, 200 + t), DType::F32);
    AdamArgs a;
    a.lr = 1e-3f;
    a.step = t;
    be->optimizer_kernels().adam_update(W32.buf(), G.buf(), M32.buf(), V32.buf(), n, a);
    be->optimizer_kernels().adam_update(W16.buf(), G.buf(), M16.buf(), V16.buf(), n, a);
  }
  // Stated bound: BF16 states (8 mantissa bits) change each element's total displacement over 10
  // steps by at most 2% of that displacement's scale.
  EXPECT_TRUE(close(applied(w0, W16.get(), 1.0), applied(w0, W32.get(), 1.0), 2e-2));
  EXPECT_TRUE(close(M16.get(), M32.get(), 1.0 / 128));
}

TEST(Sgd, MomentumFollowsTorchSemantics) {
  auto be = make_cpu_backend(1);
  const int64_t n = 9;
  const Vec w0 = random_vec(n, 43);
  DeviceBuffer W(*be, w0, DType::F32), B(*be, n, DType::F32);
  Vec w = w0, buf(n, 0.0);
  for (int t = 1; t <= 3; ++t) {
    const Vec g = random_vec(n, 300 + t);
    DeviceBuffer G(*be, g, DType::F32);
    SgdArgs a;
    a.lr = 0.1f;
    a.momentum = 0.9f;
    be->optimizer_kernels().sgd_update(W.buf(), G.buf(), B.buf(), n, a);
    for (int64_t i = 0; i < n; ++i) buf[i] = 0.9 * buf[i] + g[i], w[i] -= 0.1 * buf[i];
  }
  EXPECT_TRUE(close(W.get(), w, 1e-6));
}

TEST(Rounding, StochasticIsUnbiasedAndReproducible) {
  // x sits 30% of the way from one BF16 value to the next: nearest rounding always goes down.
  const float lo = 1.0f, hi = 1.0f + 1.0f / 128;
  const float x = lo + 0.3f * (hi - lo);
  WriteBack wb{true, 7, 3, 11};
  double sum = 0;
  const int draws = 200000;
  for (int i = 0; i < draws; ++i) sum += to_f32(write_weight<bf16>(x, wb, i));
  const double mean = sum / draws, sigma = (hi - lo) * std::sqrt(0.3 * 0.7 / draws);
  EXPECT_NEAR(mean, x, 4 * sigma);
  EXPECT_EQ(to_f32(write_weight<bf16>(x, WriteBack{false, 7, 3, 11}, 0)), lo);
  // Same counter, same bits; another step, other bits somewhere.
  int differ = 0;
  for (int i = 0; i < 1000; ++i) {
    EXPECT_EQ(write_weight<bf16>(x, wb, i).bits, write_weight<bf16>(x, wb, i).bits);
    differ += write_weight<bf16>(x, wb, i).bits != write_weight<bf16>(x, WriteBack{true, 7, 4, 11}, i).bits;
  }
  EXPECT_GT(differ, 100);
  // Values already representable are kept exactly; NaN stays NaN.
  EXPECT_EQ(to_f32(write_weight<bf16>(1.5f, wb, 5)), 1.5f);
  EXPECT_TRUE(std::isnan(to_f32(write_weight<bf16>(NAN, wb, 5))));
}

// ---------------------------------------------------------------------------------------------
// Schedule
// ---------------------------------------------------------------------------------------------

TEST(Schedule, WarmupThenCosineToMinRatio) {
  ScheduleConfig s;
  s.kind = ScheduleKind::Cosine;
  s.total_steps = 1000;
  s.warmup_steps = 100;
  s.min_lr_ratio = 0.1;
  EXPECT_DOUBLE_EQ(schedule_multiplier(s, 1), 0.01);     // warmup start: 1/100
  EXPECT_DOUBLE_EQ(schedule_multiplier(s, 50), 0.5);
  EXPECT_DOUBLE_EQ(schedule_multiplier(s, 100), 1.0);    // warmup end: the peak
  EXPECT_NEAR(schedule_multiplier(s, 550), 0.55, 1e-12); // mid-decay: 0.1 + 0.9 * 0.5
  EXPECT_NEAR(schedule_multiplier(s, 1000), 0.1, 1e-12); // last update: min_lr_ratio
  s.galore_offset = true;
  EXPECT_DOUBLE_EQ(schedule_multiplier(s, 1), 0.0);      // GaLore: the first update runs at lr 0
  EXPECT_DOUBLE_EQ(schedule_multiplier(s, 101), 1.0);
  s.galore_offset = false;
  s.kind = ScheduleKind::Linear;
  EXPECT_NEAR(schedule_multiplier(s, 550), 0.55, 1e-12);
  EXPECT_NEAR(schedule_multiplier(s, 325), 0.775, 1e-12);
  s.kind = ScheduleKind::Constant;
  EXPECT_DOUBLE_EQ(schedule_multiplier(s, 900), 1.0);
  s.warmup_steps = 0;
  s.kind = ScheduleKind::Cosine;
  EXPECT_NEAR(schedule_multiplier(s, 0), 1.0, 1e-12);
}

// Split TF32 (optim_math::split_tf32, SWAN's Newton-Schulz products on a GPU at large k): both
// halves are TF32 (13 low bits zero, so a tensor core's conversion of them is exact), hi is x
// rounded to nearest with ties away from zero (checked against an FP64 rounding to 11 significant
// bits), and x - hi - lo is within 2^-22 |x|: over 2^16 random floats of every binade from 2^-60 to
// 2^60 and the ties. A dot product of length 1024 from the three TF32 products of the halves (in
// FP64, as a tensor core's exact products) is within 2^-26 sum |a b| of the exact one; hi x hi alone,
// a plain TF32 product (the planted loss of the lo terms), misses that bound by over 100x.
TEST(SplitTf32, HalvesAreTf32AndSumToTheFloatWithin2ToTheMinus22) {
  auto bits = [](float x) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    return u;
  };
  auto round11 = [](double x) {  // to 11 significant bits, ties away from zero
    int e;
    const double f = std::frexp(std::fabs(x), &e);  // |x| = f 2^e, f in [0.5, 1)
    return std::copysign(std::ldexp(std::floor(std::ldexp(f, 11) + 0.5), e - 11), x);
  };
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> mant(1.0, 2.0);
  std::uniform_int_distribution<int> expo(-60, 60);
  std::vector<float> xs;
  for (int i = 0; i < 1 << 16; ++i) xs.push_back(static_cast<float>((i % 2 ? -1 : 1) * std::ldexp(mant(rng), expo(rng))));
  for (uint32_t u : {0x3f801000u, 0x3f803000u, 0xbf801000u, 0x3f800fffu, 0x3fffffffu}) {  // ties both ways, just under, rounding up a binade
    float x;
    std::memcpy(&x, &u, 4);
    xs.push_back(x);
  }
  for (float x : xs) {
    const optim_math::Tf32Split s = optim_math::split_tf32(x);
    ASSERT_EQ(bits(s.hi) & 0x1fffu, 0u) << x;
    ASSERT_EQ(bits(s.lo) & 0x1fffu, 0u) << x;
    ASSERT_EQ(static_cast<double>(s.hi), round11(x)) << x;
    ASSERT_LE(std::fabs(double(x) - double(s.hi) - double(s.lo)), std::ldexp(std::fabs(double(x)), -22)) << x;
  }
  const int K = 1024;
  std::vector<float> a(K), b(K);
  for (int i = 0; i < K; ++i) a[i] = static_cast<float>(mant(rng) - 1.5), b[i] = static_cast<float>(mant(rng) - 1.5);
  double exact = 0, scale = 0, split = 0, plain = 0;
  for (int i = 0; i < K; ++i) {
    const optim_math::Tf32Split x = optim_math::split_tf32(a[i]), y = optim_math::split_tf32(b[i]);
    exact += double(a[i]) * b[i], scale += std::fabs(double(a[i]) * b[i]);
    split += double(x.lo) * y.hi + double(x.hi) * y.lo + double(x.hi) * y.hi;
    plain += double(x.hi) * y.hi;
  }
  const double bound = std::ldexp(scale, -26);             // measured 1.6e-9 of scale: 0.1 x the bound
  EXPECT_LE(std::fabs(split - exact), bound);
  EXPECT_GT(std::fabs(plain - exact), 100 * bound);  // measured 7.3e-6 of scale: the bound catches a lost lo
}
