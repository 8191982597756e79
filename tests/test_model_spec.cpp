// The parameter table: exact counts of the paper's models, HF names, arena offsets, groups.
#include <gtest/gtest.h>

#include "multinorm/error.h"
#include "multinorm/model_spec.h"
#include "multinorm/param_groups.h"

using namespace multinorm;

static ModelConfig paper_config(const std::string& name) {
  return load_model_config(std::string(MULTINORM_CONFIGS_DIR) + "/models/" + name + ".json");
}

TEST(ModelSpec, PaperParameterCounts) {
  // The counts the paper and its notes give (58.1M, 134.1M, 368.0M, 1339.1M, 6738.4M).
  EXPECT_EQ(count_parameters(llama_parameters(paper_config("llama_60m"))), 58073600);
  EXPECT_EQ(count_parameters(llama_parameters(paper_config("llama_130m"))), 134105856);
  EXPECT_EQ(count_parameters(llama_parameters(paper_config("llama_350m"))), 367969280);
  EXPECT_EQ(count_parameters(llama_parameters(paper_config("llama_1b"))), 1339082752);
  EXPECT_EQ(count_parameters(llama_parameters(paper_config("llama_7b"))), 6738415616);
  EXPECT_EQ(count_parameters(llama_parameters(paper_config("llama_tiny"))), 7358720);  // 7.36M (the figure PyTorch's count gives)
  const int64_t n20 = count_parameters(llama_parameters(paper_config("llama_20m")));
  EXPECT_GT(n20, 18000000);
  EXPECT_LT(n20, 22000000);
}

TEST(ModelSpec, HuggingFaceNamesShapesAndContiguousOffsets) {
  const ModelConfig m = paper_config("llama_60m");
  const auto t = llama_parameters(m);
  ASSERT_EQ(t.size(), 1 + 8 * 9 + 2u);
  EXPECT_EQ(t.front().name, "model.embed_tokens.weight");
  EXPECT_EQ(t.front().shape, (std::vector<int64_t>{32000, 512}));
  EXPECT_EQ(t[1].name, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(t[5].name, "model.layers.0.mlp.gate_proj.weight");
  EXPECT_EQ(t[5].shape, (std::vector<int64_t>{1376, 512}));
  EXPECT_EQ(t[7].name, "model.layers.0.mlp.down_proj.weight");
  EXPECT_EQ(t[7].shape, (std::vector<int64_t>{512, 1376}));
  EXPECT_EQ(t[9].name, "model.layers.0.post_attention_layernorm.weight");
  EXPECT_EQ(t[t.size() - 2].name, "model.norm.weight");
  EXPECT_EQ(t.back().name, "lm_head.weight");
  int64_t offset = 0;
  for (const auto& s : t) {
    EXPECT_EQ(s.offset, offset) << s.name;
    offset += s.numel();
  }
  ModelConfig tied = m;
  tied.tie_word_embeddings = true;
  EXPECT_EQ(count_parameters(llama_parameters(tied)), 58073600 - 32000 * 512);
}

TEST(ModelSpec, GlobMatch) {
  EXPECT_TRUE(glob_match("model.layers.*.self_attn.q_proj.weight", "model.layers.11.self_attn.q_proj.weight"));
  EXPECT_FALSE(glob_match("model.layers.*.self_attn.q_proj.weight", "model.layers.1.self_attn.k_proj.weight"));
  EXPECT_TRUE(glob_match("*", "lm_head.weight"));
  EXPECT_TRUE(glob_match("*proj*", "model.layers.0.mlp.up_proj.weight"));
  EXPECT_FALSE(glob_match("*proj", "model.layers.0.mlp.up_proj.weight"));
  EXPECT_TRUE(glob_match("a*b*c", "aXbYbZc"));
  EXPECT_FALSE(glob_match("a*b*c", "aXbYbZ"));
  EXPECT_TRUE(glob_match("", ""));
  EXPECT_FALSE(glob_match("", "x"));
}

TEST(ParamGroups, PaperDefaultSplit) {
  const ModelConfig m = paper_config("llama_60m");
  const auto t = llama_parameters(m);
  OptimizerConfig o;
  o.name = OptimizerKind::SinkGD;
  o.fallback = OptimizerKind::Adam;
  o.matrix_params = {"model.layers.*.self_attn.q_proj.weight", "model.layers.*.self_attn.k_proj.weight",
                     "model.layers.*.self_attn.v_proj.weight", "model.layers.*.self_attn.o_proj.weight",
                     "model.layers.*.mlp.gate_proj.weight",    "model.layers.*.mlp.up_proj.weight",
                     "model.layers.*.mlp.down_proj.weight"};
  int64_t matrix = 0, fallback = 0;
  for (const auto& a : assign_optimizers(t, o)) {
    if (a.matrix) {
      EXPECT_EQ(a.optimizer, OptimizerKind::SinkGD);
      EXPECT_EQ(a.tensor->shape.size(), 2u);
      matrix += a.tensor->numel();
    } else {
      EXPECT_EQ(a.optimizer, OptimizerKind::Adam) << a.tensor->name;
      fallback += a.tensor->numel();
    }
  }
  EXPECT_EQ(matrix, 8 * (4 * 512 * 512 + 3 * 512 * 1376));
  EXPECT_EQ(fallback, 2 * 32000 * 512 + 17 * 512);
  // SinkGD cannot take a vector.
  o.matrix_params = {"*"};
  EXPECT_THROW(assign_optimizers(t, o), ConfigError);
  EXPECT_EQ(optimizer_state_slots(OptimizerKind::SinkGD), 0);
  EXPECT_EQ(optimizer_state_slots(OptimizerKind::Swan), 0);
  EXPECT_EQ(optimizer_state_slots(OptimizerKind::Adam), 2);
  EXPECT_EQ(optimizer_state_slots(OptimizerKind::Sgd, 0.9), 1);
  EXPECT_THROW(parse_choice<OptimizerKind>("lion", "optimizer.name"), ConfigError);
}
