// Every op of every backend (the CPU backend, and the CUDA backend's kernels through the emulated
// build): forward against the FP64 reference, backward against central finite differences of that
// reference (FP32 kernels: tolerances a few FP32 ulps of the data's scale).
// Odd shapes on purpose: nothing is a multiple of a block or vector width.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "../kernels/common/fast_math.h"
#include "../kernels/cpu/cpu_kernels.h"
#include "../kernels/cpu/matmul_packed.h"
#include "multinorm/backend.h"
#include "reference_llama.h"
#include "test_backends.h"
#include "test_support.h"

using namespace multinorm;
using namespace multinorm::testing;
namespace ref = multinorm::reference;

namespace {

struct Ops : ::testing::TestWithParam<std::string> {
  void SetUp() override {
    be = make_test_backend(GetParam(), 2);
    if (!be) GTEST_SKIP() << "no CUDA plugin was built";
  }
  std::unique_ptr<Backend> be;
  static constexpr DType f32 = DType::F32;
};

// qkv [B*T, 3*H*D] -> the reference's q, k, v [B,T,H,D] (same memory order per section).
void split_qkv(const Vec& qkv, int64_t N, int64_t C, Vec& q, Vec& k, Vec& v) {
  q.assign(N * C, 0), k.assign(N * C, 0), v.assign(N * C, 0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) {
      q[n * C + c] = qkv[n * 3 * C + c];
      k[n * C + c] = qkv[n * 3 * C + C + c];
      v[n * C + c] = qkv[n * 3 * C + 2 * C + c];
    }
}

// silu(gate) * up on rows of [gate | up], in FP64.
Vec swiglu_reference(const Vec& x, int64_t N, int64_t F) {
  Vec y(N * F);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t f = 0; f < F; ++f) {
      const double g = x[n * 2 * F + f], u = x[n * 2 * F + F + f];
      y[n * F + f] = g / (1 + std::exp(-g)) * u;
    }
  return y;
}

// The RoPE table [T, D/2, (cos, sin)] the model builds.
std::vector<float> rope_table(int64_t T, int64_t D, double theta) {
  std::vector<float> cs(T * D);
  for (int64_t p = 0; p < T; ++p)
    for (int64_t i = 0; i < D / 2; ++i) {
      cs[(p * D / 2 + i) * 2] = std::cos(p * std::pow(theta, -2.0 * i / D));
      cs[(p * D / 2 + i) * 2 + 1] = std::sin(p * std::pow(theta, -2.0 * i / D));
    }
  return cs;
}

}  // namespace

TEST_P(Ops, MatmulAllLayoutsAndAccumulate) {
  const int64_t M = 7, N = 5, K = 11;
  for (DType in : {DType::F32, DType::BF16}) {
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb)
        for (int acc = 0; acc < 2; ++acc) {
          Vec a = random_vec(M * K, 1), b = random_vec(K * N, 2), c0 = random_vec(M * N, 3);
          DeviceBuffer A(*be, a, in), B(*be, b, in), O(*be, c0, f32);
          a = A.get(), b = B.get();  // the values as stored (bf16-rounded)
          be->matmul(O.buf(), A.buf(), B.buf(), M, N, K, ta, tb, acc);
          Vec expect(M * N);
          for (int64_t i = 0; i < M; ++i)
            for (int64_t j = 0; j < N; ++j) {
              double s = acc ? c0[i * N + j] : 0.0;
              for (int64_t k = 0; k < K; ++k) s += (ta ? a[k * M + i] : a[i * K + k]) * (tb ? b[j * K + k] : b[k * N + j]);
              expect[i * N + j] = s;
            }
          EXPECT_TRUE(close(O.get(), expect, 1e-6)) << "ta " << ta << " tb " << tb << " acc " << acc << " " << dtype_name(in);
        }
  }
}

TEST_P(Ops, RmsNormForwardBackward) {
  // 37 rows: more than one 32-row reduction chunk; 45 columns: two 16-lane blocks and a tail
  const int64_t N = 37, C = 45;
  const double eps = 1e-5;
  const Vec x = random_vec(N * C, 4), w = random_vec(C, 5), dy = random_vec(N * C, 6);
  DeviceBuffer X(*be, x, f32), W(*be, w, f32), Y(*be, N * C, f32), R(*be, N, f32), DX(*be, N * C, f32), DW(*be, C, f32),
      DY(*be, dy, f32);
  be->rmsnorm_forward(Y.buf(), R.f32(), X.buf(), W.buf(), N, C, static_cast<float>(eps));
  EXPECT_TRUE(close(Y.get(), ref::rmsnorm(x, w.data(), N, C, eps), 1e-6));
  be->rmsnorm_backward(DX.f32(), Buf{}, DW.buf(), DY.f32(), X.buf(), W.buf(), R.f32(), N, C, false);
  const Vec gx = numeric_grad([&](const Vec& v) { return dot(dy, ref::rmsnorm(v, w.data(), N, C, eps)); }, x);
  const Vec gw = numeric_grad([&](const Vec& v) { return dot(dy, ref::rmsnorm(x, v.data(), N, C, eps)); }, w);
  EXPECT_TRUE(close(DX.get(), gx, 1e-5));
  EXPECT_TRUE(close(DW.get(), gw, 1e-5));
  // dx accumulates on request; dw always accumulates.
  be->rmsnorm_backward(DX.f32(), Buf{}, DW.buf(), DY.f32(), X.buf(), W.buf(), R.f32(), N, C, true);
  Vec gx2 = gx, gw2 = gw;
  for (auto& v : gx2) v *= 2;
  for (auto& v : gw2) v *= 2;
  EXPECT_TRUE(close(DX.get(), gx2, 1e-5));
  EXPECT_TRUE(close(DW.get(), gw2, 1e-5));
}

// A row with an Inf, a NaN, or finite values whose squares overflow FP32 comes out all NaN (never
// zeros, which would hide a diverged run as loss ln V and gradient norm 0); other rows are unchanged.
TEST_P(Ops, RmsNormTurnsANonFiniteRowIntoNaNNotZeros) {
  const int64_t N = 4, C = 40;
  Vec x = random_vec(N * C, 9), w(C, 1.0);
  x[0 * C + 7] = INFINITY;
  x[1 * C + 3] = NAN;
  for (int64_t c = 0; c < C; ++c) x[2 * C + c] = 1e20 * (c % 2 ? 1 : -1);  // finite, square 1e40 > FP32's 3.4e38
  for (DType t : {DType::F32, DType::BF16}) {
    DeviceBuffer X(*be, x, t), W(*be, w, t), Y(*be, N * C, t), R(*be, N, f32);
    be->rmsnorm_forward(Y.buf(), R.f32(), X.buf(), W.buf(), N, C, 1e-5f);
    const Vec y = Y.get();
    for (int64_t r = 0; r < 3; ++r)
      for (int64_t c = 0; c < C; ++c) ASSERT_TRUE(std::isnan(y[r * C + c])) << dtype_name(t) << " row " << r << " column " << c << ": " << y[r * C + c];
    const Vec expect = ref::rmsnorm(Vec(x.begin() + 3 * C, x.end()), w.data(), 1, C, 1e-5);
    EXPECT_TRUE(close(Vec(y.begin() + 3 * C, y.end()), expect, t == f32 ? 1e-6 : 8e-3)) << dtype_name(t);
  }
}

TEST_P(Ops, RopeForwardBackward) {
  const int64_t B = 2, T = 5, H = 3, D = 6, C = H * D, N = B * T;
  const double theta = 10000.0;
  const std::vector<float> cs = rope_table(T, D, theta);
  DeviceBuffer CS(*be, Vec(cs.begin(), cs.end()), f32);
  auto reference = [&](Vec qkv) {
    for (int64_t n = 0; n < N; ++n)
      for (int64_t s = 0; s < 2; ++s)
        for (int64_t h = 0; h < H; ++h) ref::rope(&qkv[n * 3 * C + s * C + h * D], D, n % T, theta);
    return qkv;
  };
  const Vec x = random_vec(N * 3 * C, 7), dy = random_vec(N * 3 * C, 8);
  DeviceBuffer X(*be, x, f32), DY(*be, dy, f32);
  be->rope_forward(X.buf(), CS.f32(), B, T, H, D);
  EXPECT_TRUE(close(X.get(), reference(x), 1e-6));  // v untouched, q and k rotated
  be->rope_backward(DY.buf(), CS.f32(), B, T, H, D);
  EXPECT_TRUE(close(DY.get(), numeric_grad([&](const Vec& v) { return dot(dy, reference(v)); }, x), 1e-6));
}

TEST_P(Ops, AttentionForwardBackward) {
  const int64_t B = 2, T = 7, H = 2, D = 5, C = H * D, N = B * T;
  const Vec qkv = random_vec(N * 3 * C, 9), dout = random_vec(N * C, 10);
  auto reference = [&](const Vec& x) {
    Vec q, k, v;
    split_qkv(x, N, C, q, k, v);
    return ref::attention(q, k, v, B, T, H, D);
  };
  DeviceBuffer QKV(*be, qkv, f32), O(*be, N * C, f32), LSE(*be, B * H * T, f32), DO(*be, dout, f32),
      DQKV(*be, N * 3 * C, f32);
  be->attention_forward(O.buf(), LSE.f32(), QKV.buf(), B, T, H, D);
  EXPECT_TRUE(close(O.get(), reference(qkv), 1e-6));
  be->attention_backward(DQKV.buf(), DO.buf(), QKV.buf(), O.buf(), LSE.f32(), B, T, H, D);
  EXPECT_TRUE(close(DQKV.get(), numeric_grad([&](const Vec& v) { return dot(dout, reference(v)); }, qkv), 1e-5));
  // Causality: the first position attends to itself only, so its output is v_0.
  const Vec o = O.get();
  for (int64_t h = 0; h < H; ++h)
    for (int64_t d = 0; d < D; ++d) EXPECT_NEAR(o[h * D + d], qkv[2 * C + h * D + d], 1e-6);
}

TEST_P(Ops, SwiGLUForwardBackward) {
  const int64_t N = 5, F = 37;  // two 16-wide vectors and a tail per row
  const Vec gu = random_vec(N * 2 * F, 11, 2.0), dy = random_vec(N * F, 12);
  auto reference = [&](const Vec& x) { return swiglu_reference(x, N, F); };
  DeviceBuffer GU(*be, gu, f32), Y(*be, N * F, f32), DY(*be, dy, f32), DGU(*be, N * 2 * F, f32), Y2(*be, N * F, f32),
      DGU2(*be, N * 2 * F, f32);
  be->swiglu_forward(Y.buf(), GU.buf(), N, F);
  EXPECT_TRUE(close(Y.get(), reference(gu), 1e-6));
  be->swiglu_backward(DGU.buf(), Buf{nullptr, f32}, DY.buf(), GU.buf(), N, F);
  EXPECT_TRUE(close(DGU.get(), numeric_grad([&](const Vec& v) { return dot(dy, reference(v)); }, gu), 1e-5));
  // The backward that also recomputes the forward: the forward's bits, the same gradient.
  be->swiglu_backward(DGU2.buf(), Y2.buf(), DY.buf(), GU.buf(), N, F);
  EXPECT_EQ(Y2.get(), Y.get());
  EXPECT_EQ(DGU2.get(), DGU.get());
}

TEST_P(Ops, CrossEntropyWithMaskAndScale) {
  const int64_t N = 6, V = 11;
  const float scale = 0.37f;
  const Vec logits = random_vec(N * V, 13, 3.0);
  const std::vector<int32_t> targets = {3, 0, 10, 7, 7, 1};
  const std::vector<uint8_t> mask = {1, 1, 0, 1, 0, 1};
  auto reference = [&](const Vec& x, int64_t n) { return ref::cross_entropy(&x[n * V], V, targets[n]); };
  DeviceBuffer L(*be, logits, f32), LOSS(*be, N, f32), DL(*be, N * V, f32), DL16(*be, N * V, DType::BF16);
  int32_t* t = static_cast<int32_t*>(be->allocate(N * 4));
  uint8_t* m = static_cast<uint8_t*>(be->allocate(N));
  be->to_device(t, targets.data(), N * 4);
  be->to_device(m, mask.data(), N);
  be->cross_entropy(LOSS.f32(), DL.buf(), L.f32(), t, m, N, V, scale);
  Vec expect_loss(N);
  for (int64_t n = 0; n < N; ++n) expect_loss[n] = mask[n] ? reference(logits, n) : 0.0;
  EXPECT_TRUE(close(LOSS.get(), expect_loss, 1e-6));
  const Vec g = numeric_grad([&](const Vec& x) {
    double s = 0;
    for (int64_t n = 0; n < N; ++n) s += mask[n] ? reference(x, n) : 0.0;
    return scale * s;
  }, logits);
  EXPECT_TRUE(close(DL.get(), g, 1e-5));
  // BF16 dlogits (the BF16 model's): one rounding of the same gradient; measured 2.0e-3. The loss
  // stays FP32 (measured 4.6e-8 against the reference).
  be->cross_entropy(LOSS.f32(), DL16.buf(), L.f32(), t, m, N, V, scale);
  EXPECT_TRUE(close(DL16.get(), g, 4e-3));
  EXPECT_TRUE(close(LOSS.get(), expect_loss, 1e-6));
  // In place (dlogits aliasing FP32 logits) gives the same gradient.
  be->cross_entropy(LOSS.f32(), L.buf(), L.f32(), t, m, N, V, scale);
  EXPECT_TRUE(close(L.get(), g, 1e-5));
  be->release(t);
  be->release(m);
}

// The loss head, logits = x w^T then the cross-entropy: against the FP64 reference of the same BF16
// x and w, and the backend's GEMM followed by its cross_entropy (the default that fused paths replace):
// bit for bit on the CPU (32 rows of logits at a time, never stored); on CUDA in BF16 the vocabulary
// chunks' statistics merge in another order and dlogits is exp(x - chunk max) rounded to BF16, then
// scaled and rounded again. Shapes: nothing a multiple of 32 (x packed, the last strip short), then
// whole tiles (x read in place), then one row; more rows than the fused logits buffer holds, so the
// CUDA head takes the vocabulary in chunks (150 x 130: chunks of 48, 48, 34, the scalar paths;
// 160 x 96: three of 32, 16-byte packs; 300 x 20: a vocabulary under R / 8, chunks of the smallest
// width, 8); masked rows; with and without the gradient.
TEST_P(Ops, LossHeadIsTheGemmThenCrossEntropy) {
  struct Case {
    int64_t N, V, C;
  };
  for (const Case c : {Case{45, 100, 40}, Case{64, 96, 64}, Case{1, 33, 32}, Case{150, 130, 40}, Case{160, 96, 32}, Case{300, 20, 16}}) {
    const int64_t N = c.N, V = c.V, C = c.C;
    const float scale = 0.29f;
    const Vec x = random_vec(N * C, 17, 2.0), w = random_vec(V * C, 18, 0.5);
    std::vector<int32_t> targets(N);
    std::vector<uint8_t> mask(N);
    for (int64_t i = 0; i < N; ++i) targets[i] = static_cast<int32_t>((7 * i + 3) % V), mask[i] = i % 5 != 2;
    DeviceBuffer X(*be, x, DType::BF16), W(*be, w, DType::BF16), LOGITS(*be, N * V, f32);
    DeviceBuffer LOSS(*be, N, f32), LOSS0(*be, N, f32), DL(*be, N * V, DType::BF16), DL0(*be, N * V, DType::BF16);
    int32_t* t = static_cast<int32_t*>(be->allocate(N * 4));
    uint8_t* m = static_cast<uint8_t*>(be->allocate(N));
    be->to_device(t, targets.data(), N * 4);
    be->to_device(m, mask.data(), N);
    const std::string where = "N " + std::to_string(N) + " V " + std::to_string(V) + " C " + std::to_string(C);
    be->linear_cross_entropy(LOSS.f32(), DL.buf(), LOGITS.buf(), X.buf(), W.buf(), t, m, N, V, C, scale);
    be->Backend::linear_cross_entropy(LOSS0.f32(), DL0.buf(), LOGITS.buf(), X.buf(), W.buf(), t, m, N, V, C, scale);
    if (GetParam() == "cpu") {
      EXPECT_EQ(LOSS.get(), LOSS0.get()) << where;
      EXPECT_EQ(DL.get(), DL0.get()) << where;
    } else {  // measured (emulated): losses 6.1e-8 relative, dlogits 1.7e-3 (one BF16 rounding apart)
      EXPECT_TRUE(close(LOSS.get(), LOSS0.get(), 4e-7)) << where;
      EXPECT_TRUE(close(DL.get(), DL0.get(), 4e-3)) << where;
    }
    // FP64 reference on the stored (BF16) x and w.
    const Vec xs = X.get(), ws = W.get(), loss = LOSS.get(), dl = DL.get();
    Vec logits(N * V), want_loss(N, 0.0), want_dl(N * V, 0.0);
    for (int64_t i = 0; i < N; ++i) {
      for (int64_t v = 0; v < V; ++v) {
        double z = 0;
        for (int64_t k = 0; k < C; ++k) z += xs[i * C + k] * ws[v * C + k];
        logits[i * V + v] = z;
      }
      if (!mask[i]) continue;
      want_loss[i] = ref::cross_entropy(&logits[i * V], V, targets[i]);
      double mx = -1e300, sum = 0;
      for (int64_t v = 0; v < V; ++v) mx = std::max(mx, logits[i * V + v]);
      for (int64_t v = 0; v < V; ++v) sum += std::exp(logits[i * V + v] - mx);
      for (int64_t v = 0; v < V; ++v)
        want_dl[i * V + v] = scale * (std::exp(logits[i * V + v] - mx) / sum - (v == targets[i] ? 1.0 : 0.0));
    }
    // FP32 logits of C BF16 products, the loss in FP32 (measured 4e-8 to 1.1e-7 relative); dlogits
    // rounded to BF16 once (measured 3.3e-3; 2^-9 relative, as in CrossEntropyWithMaskAndScale).
    EXPECT_TRUE(close(loss, want_loss, 4e-7)) << where;
    EXPECT_TRUE(close(dl, want_dl, 4e-3)) << where;
    // Without the gradient: the same losses.
    be->linear_cross_entropy(LOSS0.f32(), Buf{nullptr, DType::BF16}, LOGITS.buf(), X.buf(), W.buf(), t, m, N, V, C,
                             scale);
    EXPECT_EQ(LOSS0.get(), loss) << where;
    be->release(t);
    be->release(m);
  }
}

// The MLP's fused GEMM + SwiGLU pair: gate_up = x w^T and s = swiglu(gate_up); ds = dy w_down and
// swiglu_backward on it. Bit for bit the backend's GEMM followed by its swiglu op (the default the
// CPU's fused path replaces: 32 rows at a time, ds never stored), and against FP64 references of the
// same BF16 operands. Shapes as in the loss head's test: nothing a multiple of 32, whole tiles, one row.
TEST_P(Ops, MatmulSwiGLUIsTheGemmThenSwiGLU) {
  const DType bf = DType::BF16;
  struct Case {
    int64_t N, F, C;
  };
  for (const Case c : {Case{45, 40, 40}, Case{64, 64, 64}, Case{1, 33, 32}}) {
    const int64_t N = c.N, F = c.F, C = c.C;
    const std::string where = "N " + std::to_string(N) + " F " + std::to_string(F) + " C " + std::to_string(C);
    DeviceBuffer X(*be, random_vec(N * C, 21, 1.0), bf), W(*be, random_vec(2 * F * C, 22, 0.3), bf),
        DY(*be, random_vec(N * C, 23, 1.0), bf), WD(*be, random_vec(C * F, 24, 0.3), bf);
    DeviceBuffer GU(*be, N * 2 * F, bf), S(*be, N * F, bf), GU0(*be, N * 2 * F, bf), S0(*be, N * F, bf);
    be->matmul_swiglu(S.buf(), GU.buf(), X.buf(), W.buf(), N, F, C);
    be->Backend::matmul_swiglu(S0.buf(), GU0.buf(), X.buf(), W.buf(), N, F, C);
    EXPECT_EQ(GU.get(), GU0.get()) << where;
    EXPECT_EQ(S.get(), S0.get()) << where;
    DeviceBuffer DGU(*be, N * 2 * F, bf), SR(*be, N * F, bf), DS(*be, N * F, bf), DGU0(*be, N * 2 * F, bf),
        SR0(*be, N * F, bf), DS0(*be, N * F, bf);
    be->matmul_swiglu_backward(DGU.buf(), SR.buf(), DS.buf(), DY.buf(), WD.buf(), GU.buf(), N, F, C);
    be->Backend::matmul_swiglu_backward(DGU0.buf(), SR0.buf(), DS0.buf(), DY.buf(), WD.buf(), GU.buf(), N, F, C);
    EXPECT_EQ(DGU.get(), DGU0.get()) << where;
    EXPECT_EQ(SR.get(), S.get()) << where;  // the recomputed forward: the forward's bits
    // Without the recomputed forward: the same gradient.
    be->matmul_swiglu_backward(DGU0.buf(), Buf{nullptr, bf}, DS0.buf(), DY.buf(), WD.buf(), GU.buf(), N, F, C);
    EXPECT_EQ(DGU0.get(), DGU.get()) << where;
    // Where the backend fuses it, ds is never written, and the activation plan leaves it out.
    if (be->activation_layout(bf).swiglu_backward) {
      be->matmul_swiglu_backward(DGU0.buf(), Buf{nullptr, bf}, Buf{nullptr, bf}, DY.buf(), WD.buf(), GU.buf(), N, F, C);
      EXPECT_EQ(DGU0.get(), DGU.get()) << where;
    }
    // FP64 references on the stored BF16 operands.
    const Vec x = X.get(), w = W.get(), dy = DY.get(), wd = WD.get(), gu = GU.get();
    Vec want_gu(N * 2 * F, 0.0), ds(N * F, 0.0), want_dgu(N * 2 * F);
    for (int64_t i = 0; i < N; ++i) {
      for (int64_t j = 0; j < 2 * F; ++j)
        for (int64_t k = 0; k < C; ++k) want_gu[i * 2 * F + j] += x[i * C + k] * w[j * C + k];
      for (int64_t f = 0; f < F; ++f)
        for (int64_t k = 0; k < C; ++k) ds[i * F + f] += dy[i * C + k] * wd[k * F + f];
      for (int64_t f = 0; f < F; ++f) {  // d(g sigmoid(g) u): sigmoid(g) (1 + g (1 - sigmoid(g))) u, and silu(g)
        const double g = gu[i * 2 * F + f], u = gu[i * 2 * F + F + f], sg = 1 / (1 + std::exp(-g));
        want_dgu[i * 2 * F + f] = ds[i * F + f] * u * sg * (1 + g * (1 - sg));
        want_dgu[i * 2 * F + F + f] = ds[i * F + f] * g * sg;
      }
    }
    // Relative to each output's largest value: gate_up, one BF16 rounding of an FP32 sum of C
    // products (measured 2.1e-3 to 2.7e-3); s from the stored gate_up, one rounding (2.0e-3 to
    // 2.5e-3); dgate_up, after ds and then itself are rounded (2.4e-3 to 2.7e-3).
    EXPECT_TRUE(close(gu, want_gu, 5e-3)) << where;
    EXPECT_TRUE(close(S.get(), swiglu_reference(gu, N, F), 5e-3)) << where;
    EXPECT_TRUE(close(DGU.get(), want_dgu, 6e-3)) << where;
  }
}

TEST_P(Ops, EmbeddingForwardBackwardWithRepeatedTokens) {
  const int64_t V = 9, C = 6, BT = 10;
  const std::vector<int32_t> tokens = {4, 1, 4, 4, 0, 8, 1, 2, 4, 8};
  const Vec wte = random_vec(V * C, 14), dout = random_vec(BT * C, 15), dwte0 = random_vec(V * C, 16);
  for (DType dt : {DType::F32, DType::BF16}) {
    DeviceBuffer W(*be, wte, dt), O(*be, BT * C, dt), DO(*be, dout, dt), DW(*be, dwte0, dt);
    int32_t* t = static_cast<int32_t*>(be->allocate(BT * 4));
    be->to_device(t, tokens.data(), BT * 4);
    be->embedding_forward(O.buf(), t, W.buf(), BT, C);
    const Vec w_stored = W.get(), o = O.get(), d_stored = DO.get(), dw0_stored = DW.get();
    for (int64_t i = 0; i < BT; ++i)
      for (int64_t c = 0; c < C; ++c) EXPECT_EQ(o[i * C + c], w_stored[tokens[i] * C + c]);
    be->embedding_backward(DW.buf(), DO.buf(), t, BT, C);
    Vec expect = dw0_stored;
    for (int64_t i = 0; i < BT; ++i)
      for (int64_t c = 0; c < C; ++c) expect[tokens[i] * C + c] += d_stored[i * C + c];
    // FP32: exact up to summation order; BF16: one rounding of each updated row.
    EXPECT_TRUE(close(DW.get(), expect, dt == DType::F32 ? 1e-6 : 8e-3)) << dtype_name(dt);
    be->release(t);
  }
}

TEST_P(Ops, ConvertRoundsToNearestEven) {
  // 1 + 2^-8 is halfway between bf16 neighbours 1 and 1 + 2^-7: ties go to the even mantissa (1).
  const Vec v = {1.0 + std::ldexp(1.0, -8), 1.0 + 3 * std::ldexp(1.0, -8), -2.5, 65504.0};
  DeviceBuffer S(*be, v, f32), D(*be, v.size(), DType::BF16);
  be->convert(D.buf(), S.buf(), static_cast<int64_t>(v.size()));
  const Vec d = D.get();
  EXPECT_EQ(d[0], 1.0);
  EXPECT_EQ(d[1], 1.0 + std::ldexp(1.0, -6));
  EXPECT_EQ(d[2], -2.5);
  EXPECT_EQ(d[3], 65536.0);
}

// The CPU's FP32 -> BF16 conversion (kernels/cpu/bf16_rows.h: the AVX512-BF16 instruction where the
// build has it, which flushes denormal inputs) equals to_bf16 bit for bit on every class: all 2^16
// upper halves with ties, near-ties and a pseudo-random lower half (normals, zeros, denormals,
// infinities, NaNs), shuffled so that denormals sit inside blocks of normal values, and a length
// that leaves a scalar tail. A block that skipped the denormal test would flush some to zero.
TEST(Bf16Rounding, CpuRowRoundingEqualsToBf16OnEveryClass) {
  std::vector<uint32_t> bits;
  for (uint32_t hi = 0; hi < 65536; ++hi)
    for (uint32_t lo : {0x0000u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu, (hi * 2654435761u) >> 16})
      bits.push_back(hi << 16 | lo);
  std::shuffle(bits.begin(), bits.end(), std::mt19937(7));
  const int64_t n = static_cast<int64_t>(bits.size()) - 7;  // 7 never written: the tail stops at n
  auto be = make_cpu_backend(2);
  float* src = static_cast<float*>(be->allocate(bits.size() * 4));
  bf16* dst = static_cast<bf16*>(be->allocate(bits.size() * 2));
  be->to_device(src, bits.data(), bits.size() * 4);
  std::vector<uint16_t> out(bits.size(), 0xabcd);
  be->to_device(dst, out.data(), out.size() * 2);
  be->convert(Buf{dst, DType::BF16}, Buf{src, DType::F32}, n);
  be->to_host(out.data(), dst, out.size() * 2);
  int64_t wrong = 0, denormals = 0;
  for (int64_t i = 0; i < n; ++i) {
    float f;
    std::memcpy(&f, &bits[i], 4);
    denormals += std::fpclassify(f) == FP_SUBNORMAL;
    wrong += out[i] != to_bf16(f).bits;
  }
  EXPECT_EQ(wrong, 0);
  EXPECT_GT(denormals, 1000);  // the case the vector path must route around is present
  for (int64_t i = n; i < static_cast<int64_t>(out.size()); ++i) EXPECT_EQ(out[i], 0xabcd);
  be->release(src);
  be->release(dst);
}

TEST(FastMath, ExpMatchesLibmToAFewUlps) {
  double worst = 0;
  for (float x = -87.0f; x <= 88.0f; x += 0.0137f) {
    const double e = std::exp(static_cast<double>(x));
    worst = std::max(worst, std::fabs(exp_f32(x) - e) / e);
  }
  EXPECT_LT(worst, 3e-7);
  EXPECT_EQ(exp_f32(-100.0f), 0.0f);
  EXPECT_EQ(exp_f32(-INFINITY), 0.0f);
  EXPECT_EQ(exp_f32(0.0f), 1.0f);
  EXPECT_TRUE(std::isfinite(exp_f32(1000.0f)));
  EXPECT_TRUE(std::isnan(exp_f32(std::nanf(""))));  // a NaN loss must stay visible (UBSan-clean)
}

// The embedding backward's per-thread FP32 accumulators with more threads than the 256 rows an
// earlier version shared by thread id modulo 256: every token's row must be the exact sum.
// The CPU backend's SwiGLU backward in FP32 is the unfused GEMM then SwiGLU, which needs ds: without
// it (scratch the activation plan leaves out only where the fused path runs) it is an error, never a
// write through a null pointer.
TEST(OpsCpu, UnfusedSwiGLUBackwardWithoutDsIsAnError) {
  auto be = make_cpu_backend(2);
  const DType f32 = DType::F32;
  EXPECT_FALSE(be->activation_layout(f32).swiglu_backward);
  const int64_t N = 4, F = 8, C = 8;
  DeviceBuffer DGU(*be, N * 2 * F, f32), DY(*be, random_vec(N * C, 31), f32), WD(*be, random_vec(C * F, 32), f32),
      GU(*be, random_vec(N * 2 * F, 33), f32), DS(*be, N * F, f32);
  EXPECT_THROW(be->matmul_swiglu_backward(DGU.buf(), Buf{nullptr, f32}, Buf{nullptr, f32}, DY.buf(), WD.buf(), GU.buf(), N, F, C),
               Error);
  EXPECT_NO_THROW(be->matmul_swiglu_backward(DGU.buf(), Buf{nullptr, f32}, DS.buf(), DY.buf(), WD.buf(), GU.buf(), N, F, C));
}

TEST(OpsThreads, EmbeddingBackwardWithMoreThreadsThanAccumulatorSlots) {
  auto be = make_cpu_backend(300);
  const int64_t V = 1200, C = 96, BT = 6000;
  std::vector<int32_t> tokens(BT);
  for (int64_t i = 0; i < BT; ++i) tokens[i] = static_cast<int32_t>((i * 7919) % V);
  const Vec dout = random_vec(BT * C, 17);
  DeviceBuffer DO(*be, dout, DType::F32), DW(*be, V * C, DType::F32);
  int32_t* t = static_cast<int32_t*>(be->allocate(BT * 4));
  be->to_device(t, tokens.data(), BT * 4);
  be->embedding_backward(DW.buf(), DO.buf(), t, BT, C);
  Vec expect(V * C, 0.0);
  const Vec d = DO.get();
  for (int64_t i = 0; i < BT; ++i)
    for (int64_t c = 0; c < C; ++c) expect[tokens[i] * C + c] += d[i * C + c];
  EXPECT_TRUE(close(DW.get(), expect, 1e-6));  // 5 FP32 additions per row; measured 9.8e-8
  be->release(t);
  make_cpu_backend(2);  // the other tests' thread count
}

// BF16 versions of the ops: inputs rounded to BF16, compared with the FP64 reference on those
// rounded inputs. Outputs are rounded once to BF16 (relative 2^-9 = 2e-3); the bounds below are that
// plus the intermediate roundings each op has, stated per op (measured worst in the comment).
struct OpsBf16 : ::testing::TestWithParam<std::string> {
  void SetUp() override {
    be = make_test_backend(GetParam(), 2);
    if (!be) GTEST_SKIP() << "no CUDA plugin was built";
  }
  std::unique_ptr<Backend> be;
  static constexpr DType bf = DType::BF16;
};

TEST_P(OpsBf16, RmsNorm) {
  const int64_t N = 37, C = 45;  // as above
  const double eps = 1e-5;
  DeviceBuffer X(*be, random_vec(N * C, 4), bf), W(*be, random_vec(C, 5), bf), Y(*be, N * C, bf), R(*be, N, DType::F32),
      DX(*be, N * C, DType::F32), DW(*be, C, bf), DY(*be, random_vec(N * C, 6), DType::F32);
  const Vec x = X.get(), w = W.get(), dy = DY.get();
  be->rmsnorm_forward(Y.buf(), R.f32(), X.buf(), W.buf(), N, C, static_cast<float>(eps));
  EXPECT_TRUE(close(Y.get(), ref::rmsnorm(x, w.data(), N, C, eps), 4e-3));  // measured 1.4e-3
  be->rmsnorm_backward(DX.f32(), Buf{}, DW.buf(), DY.f32(), X.buf(), W.buf(), R.f32(), N, C, false);
  const Vec gx = numeric_grad([&](const Vec& v) { return dot(dy, ref::rmsnorm(v, w.data(), N, C, eps)); }, x);
  const Vec gw = numeric_grad([&](const Vec& v) { return dot(dy, ref::rmsnorm(x, v.data(), N, C, eps)); }, w);
  EXPECT_TRUE(close(DX.get(), gx, 1e-6));  // FP32 output from BF16 inputs; measured 3.3e-8
  EXPECT_TRUE(close(DW.get(), gw, 4e-3));  // one BF16 rounding; measured 1.9e-3
}

TEST_P(OpsBf16, Rope) {
  const int64_t B = 2, T = 5, H = 3, D = 6, C = H * D, N = B * T;
  const double theta = 10000.0;
  const std::vector<float> cs = rope_table(T, D, theta);
  DeviceBuffer CS(*be, Vec(cs.begin(), cs.end()), DType::F32), X(*be, random_vec(N * 3 * C, 7), bf);
  const Vec x0 = X.get();
  Vec expect = x0;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t s = 0; s < 2; ++s)
      for (int64_t h = 0; h < H; ++h) ref::rope(&expect[n * 3 * C + s * C + h * D], D, n % T, theta);
  be->rope_forward(X.buf(), CS.f32(), B, T, H, D);
  EXPECT_TRUE(close(X.get(), expect, 4e-3));  // measured 2.2e-3: one rounding
  be->rope_backward(X.buf(), CS.f32(), B, T, H, D);  // the inverse rotation: back to the input
  EXPECT_TRUE(close(X.get(), x0, 8e-3));              // two roundings; measured 2.3e-3
}

TEST_P(OpsBf16, Attention) {
  const int64_t B = 2, T = 7, H = 2, D = 5, C = H * D, N = B * T;
  DeviceBuffer QKV(*be, random_vec(N * 3 * C, 9), bf), O(*be, N * C, bf), LSE(*be, B * H * T, DType::F32),
      DO(*be, random_vec(N * C, 10), bf), DQKV(*be, N * 3 * C, bf);
  const Vec qkv = QKV.get(), dout = DO.get();
  auto reference = [&](const Vec& x) {
    Vec q, k, v;
    split_qkv(x, N, C, q, k, v);
    return ref::attention(q, k, v, B, T, H, D);
  };
  be->attention_forward(O.buf(), LSE.f32(), QKV.buf(), B, T, H, D);
  // Probabilities are rounded to BF16 before P V (the GEMM's input): two roundings.
  EXPECT_TRUE(close(O.get(), reference(qkv), 8e-3));  // measured 3.1e-3
  be->attention_backward(DQKV.buf(), DO.buf(), QKV.buf(), O.buf(), LSE.f32(), B, T, H, D);
  EXPECT_TRUE(close(DQKV.get(), numeric_grad([&](const Vec& v) { return dot(dout, reference(v)); }, qkv), 8e-3));  // measured 2.3e-3
}

TEST_P(OpsBf16, SwiGLU) {
  const int64_t N = 5, F = 37;
  DeviceBuffer GU(*be, random_vec(N * 2 * F, 11, 2.0), bf), Y(*be, N * F, bf), DY(*be, random_vec(N * F, 12), bf),
      DGU(*be, N * 2 * F, bf), Y2(*be, N * F, bf), DGU2(*be, N * 2 * F, bf);
  const Vec gu = GU.get(), dy = DY.get();
  auto reference = [&](const Vec& x) { return swiglu_reference(x, N, F); };
  be->swiglu_forward(Y.buf(), GU.buf(), N, F);
  EXPECT_TRUE(close(Y.get(), reference(gu), 4e-3));  // measured 1.5e-3
  be->swiglu_backward(DGU.buf(), Buf{nullptr, bf}, DY.buf(), GU.buf(), N, F);
  EXPECT_TRUE(close(DGU.get(), numeric_grad([&](const Vec& v) { return dot(dy, reference(v)); }, gu), 4e-3));  // measured 2.0e-3
  be->swiglu_backward(DGU2.buf(), Y2.buf(), DY.buf(), GU.buf(), N, F);
  EXPECT_EQ(Y2.get(), Y.get());
  EXPECT_EQ(DGU2.get(), DGU.get());
}

INSTANTIATE_TEST_SUITE_P(Backends, Ops, ::testing::Values("cpu", "cuda"), backend_param_name);
INSTANTIATE_TEST_SUITE_P(Backends, OpsBf16, ::testing::Values("cpu", "cuda"), backend_param_name);

// The packed GEMM (kernels/cpu/matmul_packed.cpp), on this CPU's block engine (AMX or AVX512_BF16),
// against an FP64 reference on BF16-rounded operands, on shapes that hit every edge: M, N, K below, at and past the 32 x 32 output block and the
// 32-element K tile, the in-place path (row-major a with M, K multiples of 32), all four layouts,
// FP32 and BF16 outputs, with and without accumulation. Skipped on CPUs with neither.
TEST(PackedGemm, MatchesTheFp64ReferenceOnTileEdges) {
  if (!cpu::packed_bf16_gemm_usable()) GTEST_SKIP() << "this CPU has neither AMX nor AVX512_BF16 (or MULTINORM_PACKED_GEMM=0)";
  struct Shape {
    int64_t M, N, K;
  };
  // {64, 130, 2048}: b's panels split into column groups of 2 blocks (kGroupBytes), the last one partial.
  const Shape shapes[] = {{1, 1, 1},     {7, 5, 11},    {32, 32, 32},  {33, 17, 45},    {64, 96, 64},
                          {96, 48, 688}, {31, 64, 256}, {128, 40, 33}, {64, 130, 2048}};
  cpu::PackedScratch scratch;
  double worst_f32 = 0, worst_bf16 = 0;  // error / bound, measured below
  for (const Shape& s : shapes)
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb)
        for (int acc = 0; acc < 2; ++acc)
          for (DType out_t : {DType::F32, DType::BF16}) {
            std::vector<bf16> a(s.M * s.K), b(s.K * s.N), c(s.M * s.N);
            std::vector<float> cf(s.M * s.N);
            const Vec av = random_vec(a.size(), 11), bv = random_vec(b.size(), 12), cv = random_vec(c.size(), 13);
            for (size_t i = 0; i < a.size(); ++i) a[i] = to_bf16(static_cast<float>(av[i]));
            for (size_t i = 0; i < b.size(); ++i) b[i] = to_bf16(static_cast<float>(bv[i]));
            for (size_t i = 0; i < c.size(); ++i) c[i] = to_bf16(static_cast<float>(cv[i])), cf[i] = to_f32(c[i]);
            Buf out = out_t == DType::F32 ? Buf{cf.data(), DType::F32} : Buf{c.data(), DType::BF16};
            cpu::packed_matmul(out, a.data(), b.data(), s.M, s.N, s.K, ta, tb, acc, scratch);
            double worst = 0;
            for (int64_t i = 0; i < s.M; ++i)
              for (int64_t j = 0; j < s.N; ++j) {
                double sum = acc ? to_f32(to_bf16(static_cast<float>(cv[i * s.N + j]))) : 0.0;
                double mag = std::abs(sum);
                for (int64_t k = 0; k < s.K; ++k) {
                  const double p = static_cast<double>(to_f32(ta ? a[k * s.M + i] : a[i * s.K + k])) *
                                   to_f32(tb ? b[j * s.K + k] : b[k * s.N + j]);
                  sum += p;
                  mag += std::abs(p);
                }
                const double g = out_t == DType::F32 ? cf[i * s.N + j] : to_f32(c[i * s.N + j]);
                // FP32 accumulation: K roundings of at most 2^-24 of the running magnitude (measured
                // 0.09 of it); a BF16 output adds one rounding, at most 2^-8 of the result (measured
                // 0.98 of that: a rounding's worst case is attained).
                const double bound = s.K * 6e-8 * mag + (out_t == DType::BF16 ? 3.91e-3 * std::abs(sum) : 0) + 1e-30;
                worst = std::max(worst, std::abs(g - sum) / bound);
              }
            (out_t == DType::F32 ? worst_f32 : worst_bf16) = std::max(out_t == DType::F32 ? worst_f32 : worst_bf16, worst);
            EXPECT_LE(worst, 1.0) << s.M << "x" << s.N << "x" << s.K << " ta " << ta << " tb " << tb << " acc " << acc
                                  << " out " << dtype_name(out_t);
          }
  if (std::getenv("MULTINORM_TEST_ERRORS"))
    std::printf("[ measured ] packed GEMM: worst error / bound %.3g (FP32 out), %.3g (BF16 out)\n", worst_f32, worst_bf16);
}

// The fused epilogues' row strips (packed_matmul_row_strips): a thread forms 1 to 4 strips per pass
// over b's column groups (row_strips_per_pass picks 4 for the loss head of llama_60m on a 2-core Zen
// 4). Every count gives the bits of the GEMM followed by the op: the loss head against packed_matmul
// and cross_entropy, SwiGLU's forward and backward pair against a pass of one strip. Shapes: x packed
// (200 rows: 7 strips, the last short; passes of 3 leave one strip over) and read in place (256 rows),
// K = 2048 so that b's panels form several column groups of 2 blocks (the last one partial).
TEST(PackedGemm, RowStripsGiveTheSameBitsWhateverTheStripsPerPass) {
  if (!cpu::packed_bf16_gemm_usable()) GTEST_SKIP() << "this CPU has neither AMX nor AVX512_BF16 (or MULTINORM_PACKED_GEMM=0)";
  auto bf16_vec = [](int64_t n, uint64_t seed, double scale) {
    const Vec v = random_vec(n, seed, scale);
    std::vector<bf16> out(n);
    for (int64_t i = 0; i < n; ++i) out[i] = to_bf16(static_cast<float>(v[i]));
    return out;
  };
  cpu::PackedScratch packed;
  cpu::Workspace ws;
  for (const int64_t N : {200, 256}) {
    const int64_t V = N == 200 ? 200 : 130, C = 2048, F = 100;
    const std::vector<bf16> x = bf16_vec(N * C, 31, 0.1), w = bf16_vec(V * C, 32, 0.1);
    std::vector<int32_t> targets(N);
    std::vector<uint8_t> mask(N);
    for (int64_t i = 0; i < N; ++i) targets[i] = static_cast<int32_t>((5 * i + 1) % V), mask[i] = i % 7 != 3;
    // The loss head, unfused: FP32 logits, then the cross-entropy.
    std::vector<float> logits(N * V), want_loss(N), loss(N);
    std::vector<bf16> want_dl(N * V), dl(N * V);
    cpu::packed_matmul(Buf{logits.data(), DType::F32}, x.data(), w.data(), N, V, C, false, true, false, packed);
    cpu::cross_entropy<bf16>(want_loss.data(), want_dl.data(), logits.data(), targets.data(), mask.data(), N, V, 0.01f, ws);
    // SwiGLU's pair with one strip a pass.
    const std::vector<bf16> wgu = bf16_vec(2 * F * C, 33, 0.1), dy = bf16_vec(N * C, 34, 0.1), wd = bf16_vec(C * F, 35, 0.1);
    std::vector<bf16> gu1(N * 2 * F), s1(N * F), dgu1(N * 2 * F), gu(N * 2 * F), s(N * F), dgu(N * 2 * F), sr(N * F);
    cpu::matmul_swiglu_packed(s1.data(), gu1.data(), x.data(), wgu.data(), N, F, C, packed, ws, 1);
    cpu::matmul_swiglu_backward_packed(dgu1.data(), nullptr, dy.data(), wd.data(), gu1.data(), N, F, C, packed, ws, 1);
    for (int64_t strips = 1; strips <= cpu::kMaxRowStripsPerPass; ++strips) {
      const std::string where = "N " + std::to_string(N) + ", " + std::to_string(strips) + " strips a pass";
      cpu::linear_cross_entropy_packed(loss.data(), dl.data(), x.data(), w.data(), targets.data(), mask.data(), N, V, C, 0.01f,
                                       packed, ws, strips);
      EXPECT_EQ(std::memcmp(loss.data(), want_loss.data(), N * sizeof(float)), 0) << where;
      EXPECT_EQ(std::memcmp(dl.data(), want_dl.data(), N * V * sizeof(bf16)), 0) << where;
      cpu::matmul_swiglu_packed(s.data(), gu.data(), x.data(), wgu.data(), N, F, C, packed, ws, strips);
      cpu::matmul_swiglu_backward_packed(dgu.data(), sr.data(), dy.data(), wd.data(), gu1.data(), N, F, C, packed, ws, strips);
      EXPECT_EQ(std::memcmp(gu.data(), gu1.data(), gu.size() * sizeof(bf16)), 0) << where;
      EXPECT_EQ(std::memcmp(s.data(), s1.data(), s.size() * sizeof(bf16)), 0) << where;
      EXPECT_EQ(std::memcmp(dgu.data(), dgu1.data(), dgu.size() * sizeof(bf16)), 0) << where;
      EXPECT_EQ(std::memcmp(sr.data(), s1.data(), sr.size() * sizeof(bf16)), 0) << where;  // the recomputed forward
    }
  }
}

// The threads run their own runs of output blocks and then take the others' remaining blocks from
// the back (BlockRuns in matmul_packed.cpp). Every block must be computed exactly once, whoever
// takes it: accumulated onto C, a block taken twice adds its product twice, one never taken keeps C.
// Eight threads on this machine's cores (oversubscribed, so threads are descheduled mid-run and the
// others take their blocks), 30 calls each: the bits equal one thread's, as each block's sum runs in
// one fixed order of K whichever thread computes it. Shapes with a packed a (transposed: a thread
// that takes a block from another strip packs it) and in place, in one and several column groups.
TEST(PackedGemm, EveryBlockOnceWhenThreadsTakeEachOthersBlocks) {
  if (!cpu::packed_bf16_gemm_usable()) GTEST_SKIP() << "this CPU has neither AMX nor AVX512_BF16 (or MULTINORM_PACKED_GEMM=0)";
  struct Shape {
    int64_t M, N, K;
    bool trans_a;
  };
  struct RestoreThreads {
    const int threads = omp_get_max_threads();
    ~RestoreThreads() { omp_set_num_threads(threads); }
  } restore;
  for (const Shape& s : {Shape{256, 320, 64, false}, Shape{96, 160, 2048, false}, Shape{200, 96, 100, true}}) {
    std::vector<bf16> a(s.M * s.K), b(s.K * s.N);
    const Vec av = random_vec(a.size(), 21), bv = random_vec(b.size(), 22), cv = random_vec(s.M * s.N, 23);
    for (size_t i = 0; i < a.size(); ++i) a[i] = to_bf16(static_cast<float>(av[i]));
    for (size_t i = 0; i < b.size(); ++i) b[i] = to_bf16(static_cast<float>(bv[i]));
    std::vector<float> c0(cv.begin(), cv.end());
    cpu::PackedScratch scratch;
    omp_set_num_threads(1);
    std::vector<float> expect = c0;
    cpu::packed_matmul(Buf{expect.data(), DType::F32}, a.data(), b.data(), s.M, s.N, s.K, s.trans_a, false, true, scratch);
    omp_set_num_threads(8);
    for (int call = 0; call < 30; ++call) {
      std::vector<float> got = c0;
      cpu::packed_matmul(Buf{got.data(), DType::F32}, a.data(), b.data(), s.M, s.N, s.K, s.trans_a, false, true, scratch);
      ASSERT_EQ(std::memcmp(got.data(), expect.data(), got.size() * sizeof(float)), 0)
          << s.M << "x" << s.N << "x" << s.K << " trans_a " << s.trans_a << ", call " << call;
    }
  }
}
