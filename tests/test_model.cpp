// The whole LLaMA on the CPU backend against the independent FP64 reference: logits, loss, and every
// parameter's gradient against central finite differences of the reference loss.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "multinorm/error.h"
#include "multinorm/llama_model.h"
#include "reference_llama.h"
#include "test_backends.h"
#include "test_support.h"

using namespace multinorm;
using namespace multinorm::testing;
namespace ref = multinorm::reference;

namespace {

ModelConfig tiny(bool tied = false) {
  ModelConfig m;
  m.name = "grad-check";
  m.vocab_size = 37;
  m.hidden_size = 16;
  m.intermediate_size = 24;
  m.num_hidden_layers = 2;
  m.num_attention_heads = 2;
  m.max_position_embeddings = 16;
  m.rms_norm_eps = 1e-5;
  m.initializer_range = 0.3;  // large enough that every path carries signal
  m.tie_word_embeddings = tied;
  return m;
}

struct Batch {
  int64_t B, T;
  std::vector<int32_t> tokens, targets;
  std::vector<uint8_t> mask;
  Batch(int64_t b, int64_t t, int64_t V, uint32_t seed) : B(b), T(t), tokens(b * t), targets(b * t), mask(b * t, 1) {
    std::mt19937 gen(seed);
    for (auto& x : tokens) x = static_cast<int32_t>(gen() % V);
    for (int64_t i = 0; i < b * t; ++i) targets[i] = (i % t + 1 < t) ? tokens[i + 1] : static_cast<int32_t>(gen() % V);
    // Padding at the end of the last sequence: masked positions never count.
    for (int64_t i = b * t - 2; i < b * t; ++i) mask[i] = 0, targets[i] = -1;
  }
  MicroBatch mb() const { return {tokens.data(), targets.data(), mask.data(), B, T}; }
};

}  // namespace

// (tied embeddings, backend)
class ModelGrad : public ::testing::TestWithParam<std::tuple<bool, std::string>> {};

TEST_P(ModelGrad, MatchesFiniteDifferencesOfTheFp64Reference) {
  const bool tied = std::get<0>(GetParam());
  auto be = make_test_backend(std::get<1>(GetParam()), 2);
  if (!be) GTEST_SKIP() << "no CUDA plugin was built";
  const ModelConfig cfg = tiny(tied);
  const Batch batch(2, 7, cfg.vocab_size, 17);  // T = 7: no block size divides it
  LlamaModel model(*be, cfg, DType::F32, batch.B, batch.T);
  model.init_random(5);
  const std::vector<float> p32 = model.params_to_host();
  const Vec params(p32.begin(), p32.end());

  const float scale = 0.25f;
  const LossSum loss = model.forward_backward(batch.mb(), scale);
  const double ref_loss = ref::loss_sum(cfg, params, batch.tokens, batch.targets, batch.mask, batch.B, batch.T);
  EXPECT_EQ(loss.count, batch.B * batch.T - 2);
  EXPECT_NEAR(loss.sum, ref_loss, 1e-5 * std::fabs(ref_loss));

  const std::vector<float> g32 = model.grads_to_host();
  const Vec grads(g32.begin(), g32.end());
  const Vec fd = numeric_grad([&](const Vec& p) {
    return scale * ref::loss_sum(cfg, p, batch.tokens, batch.targets, batch.mask, batch.B, batch.T);
  }, params, 1e-5);
  // Per tensor, so a wrong gradient names its tensor.
  for (const auto& t : model.tensors()) {
    const Vec a(grads.begin() + t.offset, grads.begin() + t.offset + t.numel());
    const Vec e(fd.begin() + t.offset, fd.begin() + t.offset + t.numel());
    EXPECT_TRUE(close(a, e, 2e-4, 1e-7)) << t.name;
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, ModelGrad, ::testing::Combine(::testing::Bool(), ::testing::Values("cpu", "cuda")),
                         [](const auto& i) { return std::string(std::get<0>(i.param) ? "tied_" : "untied_") + std::get<1>(i.param); });

// The tests below run on every backend.
class ModelOn : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    be = make_test_backend(GetParam(), 2);
    if (!be) GTEST_SKIP() << "no CUDA plugin was built";
  }
  std::unique_ptr<Backend> be;
};
INSTANTIATE_TEST_SUITE_P(Backends, ModelOn, ::testing::Values("cpu", "cuda"), backend_param_name);

TEST_P(ModelOn, LogitsMatchTheReference) {
  const ModelConfig cfg = tiny();
  const Batch batch(3, 5, cfg.vocab_size, 3);
  LlamaModel model(*be, cfg, DType::F32, 3, 5);
  model.init_random(1);
  const std::vector<float> p32 = model.params_to_host();
  Vec ref_logits;
  ref::loss_sum(cfg, Vec(p32.begin(), p32.end()), batch.tokens, batch.targets, batch.mask, 3, 5, &ref_logits);
  std::vector<float> logits(3 * 5 * cfg.vocab_size);
  model.logits(batch.mb(), logits.data());
  EXPECT_TRUE(close(Vec(logits.begin(), logits.end()), ref_logits, 1e-5));
}

// With BF16 activations the CPU backend fuses the loss head and the plan keeps kFusedLogitsRows rows
// of logits, so logits() runs the head that many rows at a time (150 rows: two full chunks and 22).
// The loss computed from those logits in double equals the head's own loss, position for position
// counted the same; on a backend that keeps every row, the same holds in one chunk.
TEST_P(ModelOn, Bf16LogitsInChunksGiveTheHeadsLoss) {
  const ModelConfig cfg = tiny();
  const int64_t B = 10, T = 15, N = B * T, V = cfg.vocab_size;
  static_assert(10 * 15 > 2 * kFusedLogitsRows, "the rows span a partial third chunk");
  const Batch batch(B, T, V, 4);
  LlamaModel model(*be, cfg, DType::BF16, B, T);
  model.init_random(6);
  std::vector<float> logits(N * V);
  model.logits(batch.mb(), logits.data());
  double sum = 0;
  int64_t count = 0;
  for (int64_t i = 0; i < N; ++i) {
    if (!batch.mask[i]) continue;
    const float* row = &logits[i * V];
    const double mx = *std::max_element(row, row + V);
    double z = 0;
    for (int64_t v = 0; v < V; ++v) z += std::exp(double(row[v]) - mx);
    sum += mx + std::log(z) - row[batch.targets[i]];
    ++count;
  }
  const LossSum loss = model.forward(batch.mb());
  EXPECT_EQ(count, loss.count);
  std::printf("mean loss from chunked logits %.9f, the head's %.9f\n", sum / count, loss.mean());
  EXPECT_NEAR(sum / count, loss.mean(), 2e-8 * loss.mean());  // measured 1.4e-9 (CPU), 2.1e-9 (emulated CUDA)
}

TEST_P(ModelOn, GradientsAccumulateAcrossMicroBatches) {
  const ModelConfig cfg = tiny();
  const Batch a(2, 6, cfg.vocab_size, 8), b(2, 6, cfg.vocab_size, 9);
  LlamaModel model(*be, cfg, DType::F32, 2, 6);
  model.init_random(2);
  model.forward_backward(a.mb(), 1.0f);
  const auto ga = model.grads_to_host();
  model.zero_grads();
  model.forward_backward(b.mb(), 1.0f);
  const auto gb = model.grads_to_host();
  model.zero_grads();
  model.forward_backward(a.mb(), 1.0f);
  model.forward_backward(b.mb(), 1.0f);
  const auto gab = model.grads_to_host();
  Vec sum(ga.size()), got(gab.begin(), gab.end());
  for (size_t i = 0; i < ga.size(); ++i) sum[i] = double(ga[i]) + gb[i];
  EXPECT_TRUE(close(got, sum, 1e-6));
}

TEST(Model, DeterministicForASeedAndThreadCount) {
  const ModelConfig cfg = tiny();
  const Batch batch(2, 9, cfg.vocab_size, 4);
  std::vector<float> first_grads;
  double first_loss = 0;
  for (int run = 0; run < 2; ++run) {
    auto be = make_cpu_backend(2);
    for (DType dt : {DType::BF16}) {
      LlamaModel model(*be, cfg, dt, 2, 9);
      model.init_random(42);
      const LossSum l = model.forward_backward(batch.mb(), 1.0f);
      const auto g = model.grads_to_host();
      if (run == 0) {
        first_grads = g;
        first_loss = l.sum;
      } else {
        EXPECT_EQ(std::memcmp(&first_loss, &l.sum, sizeof(double)), 0);
        ASSERT_EQ(g.size(), first_grads.size());
        EXPECT_EQ(std::memcmp(g.data(), first_grads.data(), g.size() * sizeof(float)), 0);
      }
    }
  }
}

TEST(Model, Bf16TracksFp32) {
  auto be = make_cpu_backend(2);
  ModelConfig cfg = tiny();
  cfg.initializer_range = 0.02;  // the paper's init
  cfg.vocab_size = 301;
  cfg.hidden_size = 64;
  cfg.intermediate_size = 172;
  cfg.num_attention_heads = 4;
  cfg.max_position_embeddings = 32;
  const Batch batch(2, 32, cfg.vocab_size, 5);
  LlamaModel m32(*be, cfg, DType::F32, 2, 32), m16(*be, cfg, DType::BF16, 2, 32);
  m32.init_random(3);
  m16.init_random(3);
  const LossSum l32 = m32.forward_backward(batch.mb(), 1.0f), l16 = m16.forward_backward(batch.mb(), 1.0f);
  EXPECT_NEAR(l16.mean(), l32.mean(), 0.01 * l32.mean());
  const auto g32 = m32.grads_to_host(), g16 = m16.grads_to_host();
  // Per tensor: the BF16 gradient points the same way (cosine) as the FP32 one.
  for (const auto& t : m32.tensors()) {
    double ab = 0, aa = 0, bb = 0;
    for (int64_t i = t.offset; i < t.offset + t.numel(); ++i) ab += double(g32[i]) * g16[i], aa += double(g32[i]) * g32[i], bb += double(g16[i]) * g16[i];
    EXPECT_GT(ab / std::sqrt(aa * bb + 1e-300), 0.99) << t.name;
  }
}

TEST(Model, InitIsNormalWithTheConfiguredStd) {
  auto be = make_cpu_backend(2);
  ModelConfig cfg = tiny();
  cfg.initializer_range = 0.02;
  LlamaModel model(*be, cfg, DType::F32, 1, 4);
  model.init_random(7);
  const auto p = model.params_to_host();
  const TensorSpec& emb = model.tensor("model.embed_tokens.weight");
  double s = 0, ss = 0;
  for (int64_t i = emb.offset; i < emb.offset + emb.numel(); ++i) s += p[i], ss += double(p[i]) * p[i];
  const double n = static_cast<double>(emb.numel()), mean = s / n, std_dev = std::sqrt(ss / n - mean * mean);
  EXPECT_NEAR(mean, 0.0, 4 * 0.02 / std::sqrt(n));
  EXPECT_NEAR(std_dev, 0.02, 0.02 * 0.1);
  for (int64_t i = model.tensor("model.norm.weight").offset; i < model.tensor("model.norm.weight").offset + 16; ++i)
    EXPECT_EQ(p[i], 1.0f);
  // Another seed gives other weights; the same seed the same ones.
  LlamaModel other(*be, cfg, DType::F32, 1, 4);
  other.init_random(8);
  EXPECT_NE(other.params_to_host()[emb.offset], p[emb.offset]);
  other.init_random(7);
  EXPECT_EQ(other.params_to_host(), p);
}

TEST(Model, OutOfRangeTokensAreErrorsNamingThePosition) {
  auto be = make_cpu_backend(1);
  const ModelConfig cfg = tiny();
  LlamaModel model(*be, cfg, DType::F32, 2, 4);
  model.init_random(1);
  std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6, 37, 8}, targets(8, 0);
  try {
    model.forward({tokens.data(), targets.data(), nullptr, 2, 4});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token id 37 at (sequence 1, position 2) is outside [0, 37)"), std::string::npos)
        << e.what();
  }
  tokens[6] = 7;
  targets[3] = -5;
  EXPECT_THROW(model.forward({tokens.data(), targets.data(), nullptr, 2, 4}), Error);
  std::vector<uint8_t> mask = {1, 1, 1, 0, 1, 1, 1, 1};  // a masked target is never read
  EXPECT_NO_THROW(model.forward({tokens.data(), targets.data(), mask.data(), 2, 4}));
  EXPECT_THROW(model.forward({tokens.data(), targets.data(), mask.data(), 3, 4}), Error);  // over the plan
}

// precision.grads = fp32: with gradient accumulation over 8 micro-batches, the FP32 arena holds the
// sum of the micro-batch gradients to FP32 accuracy; the BF16 arena (the paper's protocol) rounds
// every partial sum. Reference: each micro-batch's gradient alone (one FP32 rounding), summed in FP64.
TEST(Model, Fp32GradientArenaAccumulatesToFp32Accuracy) {
  const ModelConfig cfg = tiny();
  auto be = make_cpu_backend(2);
  constexpr int kMicro = 8;
  std::vector<Batch> batches;
  for (int i = 0; i < kMicro; ++i) batches.emplace_back(2, 9, cfg.vocab_size, 100 + i);
  LlamaModel f32grads(*be, cfg, DType::BF16, 2, 9, DType::F32);
  LlamaModel bf16grads(*be, cfg, DType::BF16, 2, 9);
  f32grads.init_random(7);
  bf16grads.init_random(7);
  EXPECT_EQ(f32grads.grads().dtype, DType::F32);
  EXPECT_EQ(bf16grads.grads().dtype, DType::BF16);
  Vec expect(f32grads.num_params(), 0.0);
  for (const Batch& b : batches) {
    f32grads.zero_grads();
    f32grads.forward_backward(b.mb(), 1.0f / kMicro);
    const auto g = f32grads.grads_to_host();
    for (size_t i = 0; i < g.size(); ++i) expect[i] += g[i];
  }
  f32grads.zero_grads();
  for (const Batch& b : batches) {
    f32grads.forward_backward(b.mb(), 1.0f / kMicro);
    bf16grads.forward_backward(b.mb(), 1.0f / kMicro);
  }
  auto rel_error = [&](const std::vector<float>& got) {
    double num = 0, den = 0;
    for (size_t i = 0; i < got.size(); ++i) num += (got[i] - expect[i]) * (got[i] - expect[i]), den += expect[i] * expect[i];
    return std::sqrt(num / den);
  };
  const double e32 = rel_error(f32grads.grads_to_host()), e16 = rel_error(bf16grads.grads_to_host());
  // Measured: 4.4e-8 (FP32 arena) and 3.1e-3 (BF16 arena: 8 roundings of 2^-9).
  EXPECT_LT(e32, 1e-6) << "FP32 arena";
  EXPECT_GT(e16, 3e-4) << "BF16 arena";  // what the FP32 arena fixes
  std::printf("accumulated gradient, relative error: fp32 arena %.2g, bf16 arena %.2g\n", e32, e16);
  EXPECT_THROW(LlamaModel(*be, cfg, DType::F32, 1, 2, DType::BF16), Error);  // bf16 grads of fp32 weights
}

// Incremental decoding with the key/value cache gives, at every position, the logits the full
// forward pass gives for that position (FP32: the same math, in another order).
TEST_P(ModelOn, KvCacheDecodingMatchesTheFullForward) {
  const ModelConfig cfg = tiny();
  const int64_t T = 11;
  LlamaModel model(*be, cfg, DType::F32, 1, T);
  model.init_random(3);
  std::mt19937 gen(8);
  std::vector<int32_t> ids(T);
  for (auto& t : ids) t = static_cast<int32_t>(gen() % cfg.vocab_size);
  const int64_t V = cfg.vocab_size;
  std::vector<float> full(T * V), step(V);
  model.logits({ids.data(), nullptr, nullptr, 1, T}, full.data());
  model.start_decoding();
  double worst = 0, scale = 0;
  for (int64_t p = 0; p < T; ++p) {
    model.decode_step(ids[p], step.data());
    for (int64_t v = 0; v < V; ++v) {
      worst = std::max(worst, double(std::fabs(step[v] - full[p * V + v])));
      scale = std::max(scale, double(std::fabs(full[p * V + v])));
    }
  }
  EXPECT_EQ(model.decode_position(), T);
  std::printf("kv-cache decoding vs full forward: worst %.2g relative\n", worst / scale);
  EXPECT_LT(worst, 1e-5 * scale);
  EXPECT_THROW(model.decode_step(ids[0], step.data()), Error);  // the cache is full
  model.start_decoding();  // and restarts
  model.decode_step(ids[0], step.data());
  for (int64_t v = 0; v < V; ++v) EXPECT_NEAR(step[v], full[v], 1e-5 * scale);
}
