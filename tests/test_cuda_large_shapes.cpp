// Index width: every CUDA kernel at the largest shapes the paper's 1.3B model (llama_1b: C 2048,
// F 5461, 32 heads of 64, vocabulary 32000, 1.34B parameters) and an 8192-token micro-batch (32 x 256)
// imply, against the CPU backend: 8192 x 32000 logits (262M elements, 1 GB in FP32), 2048 x 5461
// matrices, 8192 x 5461 activations, the 1.34B-element gradient arena. An index formed in 32 bits
// that overflows, or a byte offset that wraps, lands the kernel on the wrong element, which the
// comparison sees (the emulated device memory is NaN-poisoned and guarded against reads past an
// allocation, and racecheck flags misaligned accesses).
//
// In the emulated build the compute-heavy kernels (attention, cross-entropy) run only their first and
// last blocks (MULTINORM_EMU_EDGE_BLOCKS), which hold the smallest and the largest offsets, and only
// those rows are compared; every other kernel runs whole. On a GPU the whole launch runs and the same
// rows are compared. Tolerances as tests/cuda_vs_cpu.h's (FP32 1e-5, BF16 8e-3 of the largest
// compared element).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "multinorm/backend.h"
#include "multinorm/cuda_scratch.h"
#include "multinorm/dtype.h"
#include "../kernels/common/bf16.h"
#include "test_backends.h"

using namespace multinorm;

namespace {

constexpr int64_t kB = 32, kT = 256, kBT = kB * kT, kC = 2048, kF = 5461, kV = 32000, kH = 32, kD = 64;
// The reductions over the gradient arena: llama_1b's 1.34e9 BF16 elements (2.7 GB) put byte offsets
// past 2^31; 2^30 + 2^20 elements (2.15 GB) put them there too, with a fifth less to emulate.
constexpr int64_t kArena = (int64_t(1) << 30) + (int64_t(1) << 20);
constexpr double kF32 = 1e-5, kBf16 = 8e-3;

// Deterministic values in [-scale, scale): a hash of the index (fast to make at 10^9 elements).
inline float value_at(uint64_t i, uint32_t seed, float scale = 1.0f) {
  uint64_t x = (i + 1) * 0x9e3779b97f4a7c15ULL ^ (uint64_t(seed) << 32);
  x ^= x >> 29;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 32;
  return scale * (static_cast<float>(x & 0xffffff) / 8388608.0f - 1.0f);
}

// One buffer on a backend, filled from value_at or zeros, read back as floats.
class Buffer {
 public:
  Buffer(Backend& be, int64_t n, DType t, uint32_t seed = 0, float scale = 1.0f) : be_(be), n_(n), t_(t) {
    p_ = be.allocate(n * dtype_bytes(t));
    if (seed == 0) return;  // allocate() zero-fills
    const int64_t chunk = int64_t(1) << 24;
    std::vector<float> f;
    std::vector<bf16> h;
    for (int64_t at = 0; at < n; at += chunk) {
      const int64_t m = std::min(chunk, n - at);
      if (t == DType::F32) {
        f.resize(m);
        for (int64_t i = 0; i < m; ++i) f[i] = value_at(at + i, seed, scale);
        be.to_device(static_cast<char*>(p_) + at * 4, f.data(), m * 4);
      } else {
        h.resize(m);
        for (int64_t i = 0; i < m; ++i) h[i] = to_bf16(value_at(at + i, seed, scale));
        be.to_device(static_cast<char*>(p_) + at * 2, h.data(), m * 2);
      }
    }
  }
  // rows x cols values as the dense buffer of the same seed has them, in rows of `ld` elements (the
  // CUDA plan's padded MLP rows), the padding zero; with `up`, a [gate | up] row's second half from
  // column `up` on (cuda_scratch::mlp_up_column).
  Buffer(Backend& be, int64_t rows, int64_t cols, int64_t ld, DType t, uint32_t seed, float scale = 1.0f, int64_t up = 0) : Buffer(be, rows * ld, t) {
    const int64_t s = dtype_bytes(t), half = up ? cols / 2 : cols;
    std::vector<float> f(cols);
    std::vector<bf16> h(cols);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) f[c] = value_at(r * cols + c, seed, scale), h[c] = to_bf16(f[c]);
      char* row = static_cast<char*>(p_) + r * ld * s;
      const char* values = t == DType::F32 ? reinterpret_cast<const char*>(f.data()) : reinterpret_cast<const char*>(h.data());
      be.to_device(row, values, half * s);
      if (up) be.to_device(row + up * s, values + half * s, half * s);
    }
  }
  ~Buffer() { be_.release(p_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Buf buf() const { return {p_, t_}; }
  float* f32() const { return static_cast<float*>(p_); }
  // Elements [at, at + count) as floats.
  std::vector<float> get(int64_t at, int64_t count) const {
    std::vector<float> out(count);
    if (t_ == DType::F32) {
      be_.to_host(out.data(), static_cast<char*>(p_) + at * 4, count * 4);
    } else {
      std::vector<bf16> h(count);
      be_.to_host(h.data(), static_cast<char*>(p_) + at * 2, count * 2);
      for (int64_t i = 0; i < count; ++i) out[i] = to_f32(h[i]);
    }
    return out;
  }
  std::vector<float> all() const { return get(0, n_); }
  // Rows [r, r + count) of `cols` values from rows of `ld` elements, dense; with `up`, [gate | up]
  // rows whose second half starts at column `up`.
  std::vector<float> rows(int64_t r, int64_t count, int64_t cols, int64_t ld, int64_t up = 0) const {
    const int64_t half = up ? cols / 2 : cols;
    std::vector<float> out;
    for (int64_t i = r; i < r + count; ++i) {
      const std::vector<float> row = get(i * ld, half);
      out.insert(out.end(), row.begin(), row.end());
      if (!up) continue;
      const std::vector<float> second = get(i * ld + up, half);
      out.insert(out.end(), second.begin(), second.end());
    }
    return out;
  }

 private:
  Backend& be_;
  int64_t n_;
  DType t_;
  void* p_;
};

::testing::AssertionResult close(const std::vector<float>& a, const std::vector<float>& e, double rtol) {
  double scale = 0, worst = -1;
  size_t at = 0;
  for (float v : e) scale = std::max(scale, double(std::fabs(v)));
  for (size_t i = 0; i < e.size(); ++i) {
    const double d = std::fabs(double(a[i]) - e[i]);
    if (!(d <= worst)) worst = d, at = i;  // NaN is the worst
  }
  if (worst <= rtol * scale) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "element " << at << " of " << e.size() << ": " << a[at] << " vs " << e[at] << " (bound "
                                       << rtol * scale << ")";
}

// Rows [r, r + count) of an N x width matrix on both backends.
::testing::AssertionResult same_rows(const Buffer& g, const Buffer& c, int64_t width, int64_t r, int64_t count, double rtol) {
  return close(g.get(r * width, count * width), c.get(r * width, count * width), rtol);
}

struct Sampling {  // run only the edge blocks of these kernels (emulated build; ignored on a GPU)
  Sampling(const char* kernels, const char* blocks) {
    ::setenv("MULTINORM_EMU_EDGE_KERNELS", kernels, 1);
    ::setenv("MULTINORM_EMU_EDGE_BLOCKS", blocks, 1);
  }
  ~Sampling() {
    ::unsetenv("MULTINORM_EMU_EDGE_KERNELS");
    ::unsetenv("MULTINORM_EMU_EDGE_BLOCKS");
  }
};

class LargeShapes : public ::testing::Test {
 protected:
  void SetUp() override {
    const CudaProbe* p = multinorm::testing::test_cuda_plugin();
    if (!p) GTEST_SKIP() << "no CUDA plugin";
    cuda = make_cuda_backend(*p);
    cpu = make_cpu_backend(2);
  }
  std::unique_ptr<Backend> cpu, cuda;
};

}  // namespace

TEST_F(LargeShapes, EmbeddingRmsNormRopeOnAnEightThousandTokenBatch) {
  std::vector<int32_t> tokens(kBT);
  for (int64_t i = 0; i < kBT; ++i) tokens[i] = static_cast<int32_t>((i * 7919 + (i == kBT - 1 ? 0 : 3)) % kV);
  tokens[kBT - 1] = kV - 1;  // the last row of the table
  void* tc = cpu->allocate(kBT * 4);
  void* tg = cuda->allocate(kBT * 4);
  cpu->to_device(tc, tokens.data(), kBT * 4);
  cuda->to_device(tg, tokens.data(), kBT * 4);
  const auto* tcp = static_cast<const int32_t*>(tc);
  const auto* tgp = static_cast<const int32_t*>(tg);
  {
    Buffer wc(*cpu, kV * kC, DType::BF16, 1), wg(*cuda, kV * kC, DType::BF16, 1);
    Buffer xc(*cpu, kBT * kC, DType::BF16), xg(*cuda, kBT * kC, DType::BF16);
    cpu->embedding_forward(xc.buf(), tcp, wc.buf(), kBT, kC);
    cuda->embedding_forward(xg.buf(), tgp, wg.buf(), kBT, kC);
    EXPECT_TRUE(close(xg.all(), xc.all(), 0.0));
    Buffer dc(*cpu, kV * kC, DType::BF16), dg(*cuda, kV * kC, DType::BF16);
    cpu->embedding_backward(dc.buf(), xc.buf(), tcp, kBT, kC);
    cuda->embedding_backward(dg.buf(), xg.buf(), tgp, kBT, kC);
    EXPECT_TRUE(same_rows(dg, dc, kC, kV - 2, 2, kBf16)) << "the table's last rows";
    EXPECT_TRUE(close(dg.all(), dc.all(), kBf16));
  }
  {
    Buffer xc(*cpu, kBT * kC, DType::BF16, 2), xg(*cuda, kBT * kC, DType::BF16, 2), w_c(*cpu, kC, DType::BF16, 3), w_g(*cuda, kC, DType::BF16, 3);
    Buffer oc(*cpu, kBT * kC, DType::BF16), og(*cuda, kBT * kC, DType::BF16), rc(*cpu, kBT, DType::F32), rg(*cuda, kBT, DType::F32);
    cpu->rmsnorm_forward(oc.buf(), rc.f32(), xc.buf(), w_c.buf(), kBT, kC, 1e-6f);
    cuda->rmsnorm_forward(og.buf(), rg.f32(), xg.buf(), w_g.buf(), kBT, kC, 1e-6f);
    EXPECT_TRUE(close(og.all(), oc.all(), kBf16));
    EXPECT_TRUE(close(rg.all(), rc.all(), kF32));
    Buffer doc(*cpu, kBT * kC, DType::F32, 4), dog(*cuda, kBT * kC, DType::F32, 4), dxc(*cpu, kBT * kC, DType::F32), dxg(*cuda, kBT * kC, DType::F32);
    Buffer dwc(*cpu, kC, DType::F32), dwg(*cuda, kC, DType::F32);
    cpu->rmsnorm_backward(dxc.f32(), Buf{}, dwc.buf(), doc.f32(), xc.buf(), w_c.buf(), rc.f32(), kBT, kC, false);
    cuda->rmsnorm_backward(dxg.f32(), Buf{}, dwg.buf(), dog.f32(), xg.buf(), w_g.buf(), rg.f32(), kBT, kC, false);
    EXPECT_TRUE(close(dxg.all(), dxc.all(), 1e-4));  // FP32 dx: both from BF16 x, FP32 statistics in another order
    EXPECT_TRUE(close(dwg.all(), dwc.all(), 1e-4));  // dw: a sum over 8192 rows in another order
  }
  {
    std::vector<float> cs(kT * kD);
    for (int64_t p = 0; p < kT; ++p)
      for (int64_t i = 0; i < kD / 2; ++i) {
        const double a = p * std::pow(10000.0, -2.0 * i / kD);
        cs[(p * kD / 2 + i) * 2] = float(std::cos(a)), cs[(p * kD / 2 + i) * 2 + 1] = float(std::sin(a));
      }
    void* csc = cpu->allocate(cs.size() * 4);
    void* csg = cuda->allocate(cs.size() * 4);
    cpu->to_device(csc, cs.data(), cs.size() * 4);
    cuda->to_device(csg, cs.data(), cs.size() * 4);
    Buffer qc(*cpu, kBT * 3 * kC, DType::BF16, 5), qg(*cuda, kBT * 3 * kC, DType::BF16, 5);
    cpu->rope_forward(qc.buf(), static_cast<float*>(csc), kB, kT, kH, kD);
    cuda->rope_forward(qg.buf(), static_cast<float*>(csg), kB, kT, kH, kD);
    EXPECT_TRUE(close(qg.all(), qc.all(), kBf16));
    cpu->rope_backward(qc.buf(), static_cast<float*>(csc), kB, kT, kH, kD);
    cuda->rope_backward(qg.buf(), static_cast<float*>(csg), kB, kT, kH, kD);
    EXPECT_TRUE(close(qg.all(), qc.all(), kBf16));
    cpu->release(csc), cuda->release(csg);
  }
  cpu->release(tc), cuda->release(tg);
}

TEST_F(LargeShapes, AttentionForTheFirstAndLastHeadOfTheBatch) {
  // grid (T/16, B*H): 16 edge blocks are the whole of (b 0, head 0) and of (b 31, head 31)
  Sampling only("attention_forward,attention_backward_dkdv,attention_backward_dq,attention_forward_mma,attention_backward_dkdv_mma,attention_backward_dq_mma", "16");
  const int64_t C = kH * kD;
  Buffer qc(*cpu, kBT * 3 * C, DType::BF16, 6), qg(*cuda, kBT * 3 * C, DType::BF16, 6);
  Buffer oc(*cpu, kBT * C, DType::BF16), og(*cuda, kBT * C, DType::BF16), lc(*cpu, kB * kH * kT, DType::F32), lg(*cuda, kB * kH * kT, DType::F32);
  cpu->attention_forward(oc.buf(), lc.f32(), qc.buf(), kB, kT, kH, kD);
  cuda->attention_forward(og.buf(), lg.f32(), qg.buf(), kB, kT, kH, kD);
  auto head_cols = [&](const Buffer& b, int64_t batch, int64_t h, int64_t width, int64_t col0) {
    std::vector<float> v;
    for (int64_t t = 0; t < kT; ++t) {
      const auto row = b.get((batch * kT + t) * width + col0 + h * kD, kD);
      v.insert(v.end(), row.begin(), row.end());
    }
    return v;
  };
  for (const auto& [b, h] : {std::pair<int64_t, int64_t>{0, 0}, {kB - 1, kH - 1}}) {
    EXPECT_TRUE(close(head_cols(og, b, h, C, 0), head_cols(oc, b, h, C, 0), kBf16)) << "out, batch " << b << " head " << h;
    const int64_t l0 = (b * kH + h) * kT;
    EXPECT_TRUE(close(lg.get(l0, kT), lc.get(l0, kT), kF32)) << "lse, batch " << b << " head " << h;
  }
  // The backward pass from the CPU's forward results.
  Buffer dc(*cpu, kBT * C, DType::BF16, 7), dg(*cuda, kBT * C, DType::BF16, 7), dqc(*cpu, kBT * 3 * C, DType::BF16), dqg(*cuda, kBT * 3 * C, DType::BF16);
  const std::vector<float> out_c = oc.all(), lse_c = lc.all();
  {
    std::vector<bf16> h(out_c.size());
    for (size_t i = 0; i < h.size(); ++i) h[i] = to_bf16(out_c[i]);
    cuda->to_device(og.buf().ptr, h.data(), int64_t(h.size()) * 2);
    cuda->to_device(lg.f32(), lse_c.data(), int64_t(lse_c.size()) * 4);
  }
  cpu->attention_backward(dqc.buf(), dc.buf(), qc.buf(), oc.buf(), lc.f32(), kB, kT, kH, kD);
  cuda->attention_backward(dqg.buf(), dg.buf(), qg.buf(), og.buf(), lg.f32(), kB, kT, kH, kD);
  for (const auto& [b, h] : {std::pair<int64_t, int64_t>{0, 0}, {kB - 1, kH - 1}})
    for (int64_t part = 0; part < 3; ++part)  // dq, dk, dv columns of the head
      EXPECT_TRUE(close(head_cols(dqg, b, h, 3 * C, part * C), head_cols(dqc, b, h, 3 * C, part * C), kBf16))
          << "dqkv part " << part << ", batch " << b << " head " << h;
}

// SwiGLU as llama_1b trains it on a GPU: the CUDA plan's 128-byte rows (gate_up 10944 elements,
// its up half from column 5464, s and ds 5504), each row's last pack 5 of its 8 elements.
TEST_F(LargeShapes, SwiGluOnEightThousandByFiveThousandFourHundredSixtyOneInPaddedRows) {
  constexpr int64_t kLdGateUp = 10944, kLdF = 5504, kUp = 5464;
  ASSERT_EQ(cuda_scratch::mlp_gate_up_ld(kF, 2), kLdGateUp);  // the plan's rows (activation_plan.cpp)
  ASSERT_EQ(cuda_scratch::mlp_up_column(kF, kLdGateUp, 2), kUp);
  ASSERT_EQ(cuda_scratch::gemm_staged_ld(kF, 2), kLdF);
  Buffer gc(*cpu, kBT * 2 * kF, DType::BF16, 8, 2.0f), gg(*cuda, kBT, 2 * kF, kLdGateUp, DType::BF16, 8, 2.0f, kUp);
  Buffer oc(*cpu, kBT * kF, DType::BF16), og(*cuda, kBT * kLdF, DType::BF16);
  const Buf gate_up{gg.buf().ptr, DType::BF16, kLdGateUp}, out{og.buf().ptr, DType::BF16, kLdF};
  cpu->swiglu_forward(oc.buf(), gc.buf(), kBT, kF);
  cuda->swiglu_forward(out, gate_up, kBT, kF);
  EXPECT_TRUE(close(og.rows(0, kBT, kF, kLdF), oc.all(), kBf16));
  Buffer dc(*cpu, kBT * kF, DType::BF16, 9), dg(*cuda, kBT, kF, kLdF, DType::BF16, 9), dgc(*cpu, kBT * 2 * kF, DType::BF16),
      dgg(*cuda, kBT * kLdGateUp, DType::BF16);
  cpu->swiglu_backward(dgc.buf(), Buf{nullptr, DType::BF16}, dc.buf(), gc.buf(), kBT, kF);
  cuda->swiglu_backward(Buf{dgg.buf().ptr, DType::BF16, kLdGateUp}, Buf{nullptr, DType::BF16}, Buf{dg.buf().ptr, DType::BF16, kLdF}, gate_up,
                        kBT, kF);
  EXPECT_TRUE(close(dgg.rows(kBT - 4, 4, 2 * kF, kLdGateUp, kUp), dgc.get((kBT - 4) * 2 * kF, 4 * 2 * kF), kBf16)) << "the last rows";
  EXPECT_TRUE(close(dgg.rows(0, kBT, 2 * kF, kLdGateUp, kUp), dgc.all(), kBf16));
  // between the halves and past them, the zeros allocate() wrote (SwiGLUOverPaddedRowsOffAPack plants sentinels there)
  EXPECT_EQ(dgg.get(kF, kUp - kF), std::vector<float>(kUp - kF, 0.0f));
  EXPECT_EQ(dgg.get((kBT - 1) * kLdGateUp + kUp + kF, kLdGateUp - kUp - kF), std::vector<float>(kLdGateUp - kUp - kF, 0.0f));
}

TEST_F(LargeShapes, CrossEntropyOnEightThousandRowsOfThirtyTwoThousandLogits) {
  Sampling only("cross_entropy", "4");  // one block per row: rows 0-3 and 8188-8191
  std::vector<int32_t> targets(kBT);
  for (int64_t i = 0; i < kBT; ++i) targets[i] = static_cast<int32_t>((i * 104729) % kV);
  targets[kBT - 1] = kV - 1;
  void* tc = cpu->allocate(kBT * 4);
  void* tg = cuda->allocate(kBT * 4);
  cpu->to_device(tc, targets.data(), kBT * 4);
  cuda->to_device(tg, targets.data(), kBT * 4);
  {
    Buffer lc(*cpu, kBT * kV, DType::F32, 10, 4.0f), lg(*cuda, kBT * kV, DType::F32, 10, 4.0f);
    Buffer sc(*cpu, kBT, DType::F32), sg(*cuda, kBT, DType::F32), dc(*cpu, kBT * kV, DType::BF16), dg(*cuda, kBT * kV, DType::BF16);
    cpu->cross_entropy(sc.f32(), dc.buf(), lc.f32(), static_cast<int32_t*>(tc), nullptr, kBT, kV, 1.0f / kBT);
    cuda->cross_entropy(sg.f32(), dg.buf(), lg.f32(), static_cast<int32_t*>(tg), nullptr, kBT, kV, 1.0f / kBT);
    for (int64_t r : {int64_t(0), kBT - 4}) {
      EXPECT_TRUE(close(sg.get(r, 4), sc.get(r, 4), kF32)) << "losses from row " << r;
      EXPECT_TRUE(same_rows(dg, dc, kV, r, 4, kBf16)) << "dlogits from row " << r;
    }
  }
  cpu->release(tc), cuda->release(tg);
}

TEST_F(LargeShapes, ReductionsAndCastsOverTheWholeGradientArena) {
  {  // the global gradient norm over a BF16 gradient arena whose byte offsets pass 2^31; the
     // reference is summed here in FP64 (the CPU backend's sum_squares is tested against it
     // elsewhere), which saves a second 2.15 GB buffer
    std::vector<bf16> h(kArena);
    double expected = 0;
    for (int64_t i = 0; i < kArena; ++i) {
      h[i] = to_bf16(value_at(i, 11));
      const double v = to_f32(h[i]);
      expected += v * v;
    }
    Buffer g(*cuda, kArena, DType::BF16);
    cuda->to_device(g.buf().ptr, h.data(), kArena * 2);
    const double sg = cuda->optimizer_kernels().sum_squares(g.buf(), kArena);
    EXPECT_NEAR(sg, expected, 1e-9 * expected);  // FP64 sums of exact BF16 squares: only the order differs
    // The elementwise kernels (scale, clip_gradients: one grid-stride loop) on a view that starts past
    // 2^31 bytes, and its neighbours left alone. (Over the whole arena they cost 27 s of emulation and
    // prove nothing more: their index is the same 64-bit loop lint_cuda enforces.)
    const int64_t tail = int64_t(1) << 20, from = kArena - tail;
    cuda->optimizer_kernels().scale(g.buf().at(from), tail, 0.5f);  // exact: halving a BF16 value
    for (int64_t at : {from - 1024, from, kArena - 1024}) {
      const std::vector<float> got = g.get(at, 1024);
      for (int64_t i = 0; i < 1024; ++i) ASSERT_EQ(got[i], (at + i >= from ? 0.5f : 1.0f) * to_f32(h[at + i])) << "element " << at + i;
    }
  }
  {  // casts of the largest tensor (the embedding, 32000 x 2048)
    Buffer fc(*cpu, kV * kC, DType::F32, 12), fg(*cuda, kV * kC, DType::F32, 12), bc(*cpu, kV * kC, DType::BF16), bg(*cuda, kV * kC, DType::BF16);
    cpu->convert(bc.buf(), fc.buf(), kV * kC);
    cuda->convert(bg.buf(), fg.buf(), kV * kC);
    EXPECT_TRUE(close(bg.all(), bc.all(), 0.0));  // round to nearest even on both
  }
}

TEST_F(LargeShapes, OptimizersOnTheLargestMatricesAndTheEmbedding) {
  for (const auto& [m, n] : {std::pair<int64_t, int64_t>{kC, kF}, {kF, kC}}) {
    Buffer wc(*cpu, m * n, DType::BF16, 13, 0.05f), wg(*cuda, m * n, DType::BF16, 13, 0.05f), gc(*cpu, m * n, DType::BF16, 14),
        gg(*cuda, m * n, DType::BF16, 14);
    SinkGDArgs a;
    a.lr = 1e-3f;
    cpu->optimizer_kernels().sinkgd_update(wc.buf(), gc.buf(), m, n, a);
    cuda->optimizer_kernels().sinkgd_update(wg.buf(), gg.buf(), m, n, a);
    EXPECT_TRUE(close(wg.all(), wc.all(), kBf16)) << m << " x " << n;
  }
  const int64_t n = kV * kC;
  Buffer wc(*cpu, n, DType::BF16, 15, 0.05f), wg(*cuda, n, DType::BF16, 15, 0.05f), gc(*cpu, n, DType::BF16, 16), gg(*cuda, n, DType::BF16, 16);
  Buffer mc(*cpu, n, DType::F32), mg(*cuda, n, DType::F32), vc(*cpu, n, DType::F32), vg(*cuda, n, DType::F32);
  AdamArgs a;
  a.lr = 1e-3f;
  cpu->optimizer_kernels().adam_update(wc.buf(), gc.buf(), mc.buf(), vc.buf(), n, a);
  cuda->optimizer_kernels().adam_update(wg.buf(), gg.buf(), mg.buf(), vg.buf(), n, a);
  EXPECT_TRUE(close(wg.get(n - 4096, 4096), wc.get(n - 4096, 4096), kBf16)) << "the embedding's last rows";
  EXPECT_TRUE(close(vg.get(n - 4096, 4096), vc.get(n - 4096, 4096), kF32));
  SgdArgs s;
  s.lr = 1e-3f, s.momentum = 0.9f;
  cpu->optimizer_kernels().sgd_update(wc.buf(), gc.buf(), mc.buf(), n, s);
  cuda->optimizer_kernels().sgd_update(wg.buf(), gg.buf(), mg.buf(), n, s);
  EXPECT_TRUE(close(wg.get(n - 4096, 4096), wc.get(n - 4096, 4096), kBf16)) << "SGD, the embedding's last rows";
}
