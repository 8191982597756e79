// Data parallelism's plans: the sharded optimizer's assignment of tensors to ranks (balance by the
// cost model, determinism, memory per rank) and the backward pass's gradient-ready ranges the
// buckets are built from. The collectives and the trainer on 2 and 3 ranks are tested under mpirun
// (tests/test_communicators.cpp, tests/data_parallel.sh, tests/cuda_training.sh).
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "multinorm/llama_model.h"
#include "multinorm/model_config.h"
#include "multinorm/param_groups.h"
#include "multinorm/run_config.h"
#include "multinorm/shard_plan.h"
#include "test_backends.h"

using namespace multinorm;

namespace {
RunConfig run_for(const std::string& model, const std::string& optimizer) {
  json doc = {{"model", {{"config", std::string(MULTINORM_CONFIGS_DIR) + "/models/" + model + ".json"}}},
              {"optimizer", {{"name", optimizer}}}};
  return run_config_from_json(doc, "test");
}
}  // namespace

TEST(ShardPlan, BalancesByCostWithinTheLptBound) {
  for (const std::string opt : {"sinkgd", "swan", "adam"})
    for (const std::string model : {"llama_60m", "llama_1b"})
      for (int world : {2, 3, 8}) {
        const RunConfig run = run_for(model, opt);
        const auto specs = llama_parameters(run.model);
        const auto assign = assign_optimizers(specs, run.optimizer);
        const ShardPlan plan = plan_shards(assign, run, world, 0, true);
        ASSERT_EQ(plan.owner.size(), assign.size());
        std::vector<double> load(static_cast<size_t>(world), 0.0);
        for (size_t i = 0; i < assign.size(); ++i) {
          ASSERT_GE(plan.owner[i], 0);
          ASSERT_LT(plan.owner[i], world);
          load[static_cast<size_t>(plan.owner[i])] += plan.cost[i];
        }
        // Longest-processing-time is within 4/3 of the optimum, and the optimum is at least the
        // mean load and the largest single tensor.
        const double total = std::accumulate(plan.cost.begin(), plan.cost.end(), 0.0);
        const double lower = std::max(total / world, *std::max_element(plan.cost.begin(), plan.cost.end()));
        EXPECT_LE(*std::max_element(load.begin(), load.end()), 4.0 / 3.0 * lower) << opt << " " << model << " on " << world;
        // Every rank computes the same plan from its own rank.
        EXPECT_EQ(plan_shards(assign, run, world, world - 1, true).owner, plan.owner);
      }
}

TEST(ShardPlan, SwanCostFollowsTheWhiteningNotTheBytes) {
  // SWAN's cost is dominated by Newton-Schulz on the k x k Gram matrix, k = min(m, n): a 2048x5461
  // MLP matrix costs about what a 2048x2048 attention matrix costs (the Gram products add
  // 4 k^2 max(m,n) to 6 ns_steps k^3), not its 2.7x bytes; Adam's cost is its bytes.
  const RunConfig swan = run_for("llama_1b", "swan"), adam = run_for("llama_1b", "adam");
  const auto specs = llama_parameters(swan.model);
  const auto a_swan = assign_optimizers(specs, swan.optimizer), a_adam = assign_optimizers(specs, adam.optimizer);
  const size_t q = 1, gate = 5;  // layer 0's q_proj and gate_proj (after the embedding)
  ASSERT_EQ(specs[gate].shape[0], 5461);
  EXPECT_NEAR(update_cost(a_adam[gate], adam) / update_cost(a_adam[q], adam), 5461.0 / 2048.0, 1e-9);
  const double steps = static_cast<double>(swan.optimizer.swan.ns_steps), r = 5461.0 / 2048.0;
  EXPECT_NEAR(update_cost(a_swan[gate], swan) / update_cost(a_swan[q], swan), (4 * r + 6 * steps) / (4 + 6 * steps), 0.01);
}

TEST(ShardPlan, StatesPerRankFallWithTheWorldAndSumToTheWhole) {
  const RunConfig run = run_for("llama_60m", "adam");
  const auto specs = llama_parameters(run.model);
  const auto assign = assign_optimizers(specs, run.optimizer);
  const std::vector<int64_t> whole = state_bytes_per_rank(plan_shards(assign, run, 1, 0, true), assign, run);
  ASSERT_EQ(whole.size(), 1u);
  int64_t previous = whole[0];
  for (int world : {2, 4, 8}) {
    const auto per_rank = state_bytes_per_rank(plan_shards(assign, run, world, 0, true), assign, run);
    EXPECT_EQ(std::accumulate(per_rank.begin(), per_rank.end(), int64_t{0}), whole[0]);
    // The largest share falls until it is one whole tensor's state (here the embedding's Adam
    // state at 8 ranks: 32000 x 512 x 2 states x 2 bytes): whole tensors are never split.
    const int64_t largest = *std::max_element(per_rank.begin(), per_rank.end());
    if (world == 2) {
      EXPECT_LT(largest, whole[0] * 6 / 10);
    }
    EXPECT_LE(largest, previous) << world;
    EXPECT_GE(largest, 32000 * 512 * 2 * 2) << world;
    previous = largest;
    // Not sharded: every rank holds everything.
    for (int64_t b : state_bytes_per_rank(plan_shards(assign, run, world, 0, false), assign, run)) EXPECT_EQ(b, whole[0]);
  }
  EXPECT_FALSE(plan_shards(assign, run, 1, 0, true).sharded());
  EXPECT_FALSE(plan_shards(assign, run, 4, 0, false).sharded());
}

TEST(GradientReadyOrder, TilesTheArenaInBackwardOrder) {
  for (bool tied : {false, true}) {
    ModelConfig cfg;
    cfg.vocab_size = 61, cfg.hidden_size = 16, cfg.intermediate_size = 24, cfg.num_hidden_layers = 3;
    cfg.num_attention_heads = 2, cfg.max_position_embeddings = 8, cfg.tie_word_embeddings = tied;
    auto be = make_cpu_backend(1);
    LlamaModel model(*be, cfg, DType::F32, 1, 8);
    const auto order = model.store().gradient_ready_order();
    ASSERT_EQ(order.size(), 5u);  // head, 3 layers, embedding
    EXPECT_EQ(order.front().second, model.num_params());
    EXPECT_EQ(order.front().first, model.tensor("model.norm.weight").offset);
    EXPECT_EQ(order.back(), std::make_pair(int64_t{0}, int64_t{61 * 16}));
    for (size_t i = 0; i + 1 < order.size(); ++i) EXPECT_EQ(order[i + 1].second, order[i].first) << i;  // no gap, no overlap
    EXPECT_EQ(order[1].first, model.tensor("model.layers.2.self_attn.q_proj.weight").offset);
  }
}

// Owner runs are arena ranges: over llama_60m's dense arena and llama_1b's CUDA one, whose down
// projections' rows are padded (layout_arena), each padded tensor's run covering its padding.
TEST(ShardPlan, OwnerRunsTileARangeByOwner) {
  for (const char* model : {"llama_60m", "llama_1b"}) {
    const RunConfig run = run_for(model, "swan");
    auto specs = llama_parameters(run.model);
    layout_arena(specs, true, 2, 2);
    const auto assign = assign_optimizers(specs, run.optimizer);
    const ShardPlan plan = plan_shards(assign, run, 3, 1, true);
    const int64_t begin = specs[1].arena_offset, end = specs[20].arena_offset;  // from layer 0's q_proj, 19 tensors
    const auto runs = owner_runs(plan, specs, begin, end);
    ASSERT_FALSE(runs.empty());
    EXPECT_EQ(runs.front().begin, begin);
    EXPECT_EQ(runs.back().end, end);
    for (size_t k = 0; k + 1 < runs.size(); ++k) {
      EXPECT_EQ(runs[k].end, runs[k + 1].begin);        // contiguous, no gap
      EXPECT_NE(runs[k].owner, runs[k + 1].owner);      // maximal runs
    }
    for (size_t i = 1; i < 20; ++i) {                   // every tensor lies in a run of its owner, padding and all
      const TensorSpec& t = specs[i];
      const auto it = std::find_if(runs.begin(), runs.end(), [&](const OwnerRun& r) { return r.begin <= t.arena_offset && t.arena_offset < r.end; });
      ASSERT_NE(it, runs.end());
      EXPECT_EQ(it->owner, plan.owner[i]) << t.name;
      EXPECT_LE(t.arena_offset + t.arena_numel(), it->end) << t.name;
    }
    EXPECT_EQ(specs[7].arena_ld, std::string(model) == "llama_1b" ? 5504 : 0);
  }
}
