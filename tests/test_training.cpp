// The optimizer layer driving the model: parameter groups, learning rates, clipping, state memory,
// and a short training run per optimizer on a fixed small corpus (the loss must fall).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "multinorm/error.h"
#include "multinorm/optimizer.h"

using namespace multinorm;

namespace {

json tiny_run(const std::string& optimizer) {
  return json::parse(R"({
    "model": {"config": {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                         "num_attention_heads": 2, "max_position_embeddings": 32}},
    "batch": {"global_batch": 8, "micro_batch": 8, "seq_len": 32},
    "schedule": {"kind": "constant", "total_steps": 40, "warmup_steps": 0},
    "precision": {"params": "fp32", "optimizer_states": "fp32"},
    "seed": 3,
    "optimizer": {"name": ")" + optimizer + R"("}})");
}

// A fixed corpus from a sparse Markov chain over 64 tokens: each token has two likely successors,
// so a model can learn it within a few dozen updates.
struct Corpus {
  std::vector<int32_t> tokens, targets;
  Corpus(int64_t B, int64_t T, uint32_t seed) : tokens(B * T), targets(B * T) {
    std::mt19937 gen(seed);
    std::vector<int32_t> stream(B * T + 1);
    stream[0] = 0;
    for (size_t i = 1; i < stream.size(); ++i) {
      const int32_t prev = stream[i - 1];
      const uint32_t r = gen() % 10;
      stream[i] = r < 6 ? (prev * 7 + 3) % 64 : r < 9 ? (prev * 13 + 5) % 64 : static_cast<int32_t>(gen() % 64);
    }
    for (int64_t i = 0; i < B * T; ++i) tokens[i] = stream[i], targets[i] = stream[i + 1];
  }
};

}  // namespace

class Training : public ::testing::TestWithParam<std::string> {};

TEST_P(Training, LossFallsOnASmallFixedCorpus) {
  const RunConfig run = run_config_from_json(tiny_run(GetParam()), "test");
  auto be = make_cpu_backend(2);
  LlamaModel model(*be, run.model, run.precision.params, 8, 32);
  model.init_random(run.seed);
  Optimizer opt(model, run);
  std::vector<double> losses;
  for (int64_t step = 1; step <= 40; ++step) {
    const Corpus c(8, 32, static_cast<uint32_t>(step % 4));  // four fixed batches, cycled
    const MicroBatch mb{c.tokens.data(), c.targets.data(), nullptr, 8, 32};
    model.zero_grads();
    const LossSum l = model.forward_backward(mb, 1.0f / static_cast<float>(mb.count_targets()));
    losses.push_back(l.mean());
    const StepStats st = opt.step(step, step);
    ASSERT_TRUE(std::isfinite(st.grad_norm));
  }
  const double first = (losses[0] + losses[1] + losses[2] + losses[3]) / 4;
  const double last = (losses[36] + losses[37] + losses[38] + losses[39]) / 4;
  EXPECT_LT(last, first - 0.5) << GetParam() << ": " << first << " -> " << last;
  EXPECT_NEAR(losses[0], std::log(64.0), 0.1);  // a fresh model is near uniform
}

INSTANTIATE_TEST_SUITE_P(Optimizers, Training, ::testing::Values("sinkgd", "swan", "adam", "adamw", "sgd"));

TEST(OptimizerLayer, GroupsLearningRatesAndStateMemory) {
  json j = tiny_run("sinkgd");
  j["optimizer"]["lr"] = 0.02;
  j["optimizer"]["alpha"] = 0.05;
  j["schedule"] = {{"kind", "cosine"}, {"total_steps", 100}, {"warmup_steps", 10}};
  const RunConfig run = run_config_from_json(j, "test");
  auto be = make_cpu_backend(1);
  LlamaModel model(*be, run.model, DType::F32, 1, 8);
  model.init_random(1);
  Optimizer opt(model, run);
  EXPECT_EQ(opt.matrix_state_bytes(), 0);  // SinkGD keeps nothing for the matrices
  int64_t fallback = 0;
  for (const auto& a : opt.assignments()) fallback += a.matrix ? 0 : a.tensor->numel();
  EXPECT_EQ(opt.state_bytes(), fallback * 2 * 4);  // Adam m, v in FP32 for the rest
  const StepStats st = opt.step(10, 10);
  EXPECT_DOUBLE_EQ(st.lr_multiplier, 1.0);
  EXPECT_DOUBLE_EQ(st.lr_fallback, 0.02);
  EXPECT_DOUBLE_EQ(st.lr_matrix, 0.02 * 0.05);
  j["optimizer"]["name"] = "adam";
  Optimizer adam(model, run_config_from_json(j, "test"));
  EXPECT_DOUBLE_EQ(adam.step(10, 10).lr_matrix, 0.02);  // alpha applies to SinkGD/SWAN only
  EXPECT_EQ(adam.state_bytes(), model.num_params() * 2 * 4);
}

TEST(OptimizerLayer, ClippingAndNonFiniteGradients) {
  json j = tiny_run("sgd");
  j["optimizer"]["grad_clip"] = 0.5;
  j["optimizer"]["fallback"] = "sgd";
  const RunConfig run = run_config_from_json(j, "test");
  auto be = make_cpu_backend(1);
  LlamaModel model(*be, run.model, DType::F32, 2, 8);
  model.init_random(1);
  const Corpus c(2, 8, 1);
  model.forward_backward({c.tokens.data(), c.targets.data(), nullptr, 2, 8}, 10.0f);
  Optimizer opt(model, run);
  const std::vector<float> before = model.params_to_host();
  const StepStats st = opt.step(1, 1);
  EXPECT_TRUE(st.clipped);
  EXPECT_GT(st.grad_norm, 0.5);
  EXPECT_NEAR(std::sqrt(be->sum_squares(model.grads(), model.num_params())), 0.5, 1e-4);
  // SGD with lr 0.02: the weights moved by exactly lr x the clipped gradient.
  const std::vector<float> after = model.params_to_host(), g = model.grads_to_host();
  for (size_t i = 0; i < after.size(); i += 97) EXPECT_NEAR(after[i], before[i] - 0.02f * g[i], 1e-6);
  // A NaN gradient leaves the weights untouched and is reported.
  std::vector<float> nan_grads(model.num_params(), 0.0f);
  nan_grads[5] = NAN;
  be->to_device(model.grads().ptr, nan_grads.data(), nan_grads.size() * 4);
  const StepStats bad = opt.step(2, 2);
  EXPECT_FALSE(std::isfinite(bad.grad_norm));
  EXPECT_EQ(model.params_to_host(), after);
}

// Adam's bias correction counts applied updates: update 7 after 6 skipped ones is Adam's first step.
TEST(OptimizerLayer, SkippedUpdatesDoNotAdvanceAdamsBiasCorrection) {
  json j = tiny_run("adam");
  j["schedule"]["kind"] = "constant";
  j["schedule"]["warmup_steps"] = 0;
  const RunConfig run = run_config_from_json(j, "test");
  auto be = make_cpu_backend(1);
  const Corpus c(2, 8, 1);
  auto weights_after = [&](int64_t update, int64_t applied) {
    LlamaModel model(*be, run.model, DType::F32, 2, 8);
    model.init_random(1);
    model.forward_backward({c.tokens.data(), c.targets.data(), nullptr, 2, 8}, 1.0f);
    Optimizer opt(model, run);
    opt.step(update, applied);
    return model.params_to_host();
  };
  const auto first = weights_after(1, 1);
  EXPECT_EQ(weights_after(7, 1), first);  // bit-exact: the same Adam step
  EXPECT_NE(weights_after(7, 7), first);  // t = 7 would scale m-hat and v-hat differently
}

TEST(OptimizerLayer, UnknownOptimizerAndVectorMatrixParamsAreErrors) {
  EXPECT_THROW(make_rule("lion", OptimizerConfig{}), ConfigError);
  json j = tiny_run("sinkgd");
  j["optimizer"]["matrix_params"] = json::array({"*norm*"});
  const RunConfig run = run_config_from_json(j, "test");
  auto be = make_cpu_backend(1);
  LlamaModel model(*be, run.model, DType::F32, 1, 8);
  EXPECT_THROW(Optimizer(model, run), ConfigError);
}
