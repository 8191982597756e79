// The parameter table: exact counts of the paper's models, HF names, arena offsets, groups.
#include <gtest/gtest.h>

#include "multinorm/error.h"
#include "multinorm/linear.h"
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

// The backends' arenas: the CUDA layout (pad_mlp_rows) gives the down projection 128-byte rows where
// F's are off 16 bytes in the weights' or gradients' dtype (llama_1b's 5461: 5504 elements with BF16
// weights, either gradient dtype; 5472 with FP32 weights: 128 bytes of floats), and the gate and up
// projections F rows and zero rows up to a whole pack of the weights' dtype (5464 either way: the
// column where the padded gate/up activation's up half starts, Linear::extent); every other tensor
// and every other model dense; arena offsets contiguous and the logical ones untouched. A down
// projection whose arena offset would be off 16 bytes stays dense; the gate/up rows are padded still
// (the activations' layout asks for them whatever the weights' offsets).
TEST(ModelSpec, ArenaLayoutPadsTheMlpWhereItsRowsAreOff16Bytes) {
  struct Case {
    const char* model;
    bool pad;
    int64_t param_bytes, grad_bytes, down_ld, gate_up_rows;
  };
  for (const Case c : {Case{"llama_1b", true, 2, 2, 5504, 5464}, Case{"llama_1b", true, 2, 4, 5504, 5464}, Case{"llama_1b", true, 4, 4, 5472, 5464},
                       Case{"llama_1b", false, 2, 2, 0, 0}, Case{"llama_60m", true, 2, 2, 0, 0}}) {
    auto specs = llama_parameters(paper_config(c.model));
    const auto logical = specs;
    const int64_t elements = layout_arena(specs, c.pad, c.param_bytes, c.grad_bytes);
    int64_t at = 0, padding = 0;
    for (size_t i = 0; i < specs.size(); ++i) {
      const TensorSpec& t = specs[i];
      const bool gate_or_up = t.role == TensorRole::MlpGate || t.role == TensorRole::MlpUp;
      EXPECT_EQ(t.offset, logical[i].offset) << t.name;
      EXPECT_EQ(t.arena_offset, at) << t.name;
      EXPECT_EQ(t.arena_ld, t.role == TensorRole::MlpDown ? c.down_ld : 0) << c.model << " " << t.name;
      EXPECT_EQ(t.arena_rows, gate_or_up ? c.gate_up_rows : 0) << c.model << " " << t.name;
      at += t.arena_numel(), padding += t.arena_numel() - t.numel();
    }
    EXPECT_EQ(elements, at);
    EXPECT_EQ(arena_elements(specs), at);
    const int64_t down = c.down_ld ? 24 * 2048 * (c.down_ld - 5461) : 0, gate_up = c.gate_up_rows ? 24 * 2 * (c.gate_up_rows - 5461) * 2048 : 0;
    EXPECT_EQ(padding, down + gate_up) << c.model;
  }
  ModelConfig odd;  // C = 6: the first down projection at element 678, 1356 bytes in: left dense
  odd.vocab_size = 7, odd.hidden_size = 6, odd.intermediate_size = 41, odd.num_hidden_layers = 2, odd.num_attention_heads = 2;
  auto specs = llama_parameters(odd);
  EXPECT_EQ(layout_arena(specs, true, 2, 2), count_parameters(specs) + 2 * 2 * (48 - 41) * 6);
  for (const TensorSpec& t : specs) EXPECT_EQ(t.arena_ld, 0) << t.name;
}

// The gate/up projection by halves needs the activation's up column and the weight's up row to be
// one number (the arena's zero rows, TensorSpec::arena_rows): a mismatch either way is an error, not
// GEMMs over the wrong rows. F = 41 in BF16: the up half at column 48 of a padded activation.
TEST(Linear, GateUpHalvesNeedTheActivationAndTheArenaToAgree) {
  const Buf dense{nullptr, DType::BF16, 0}, padded{nullptr, DType::BF16, 128};
  const Linear arena_rows{Buf{}, Buf{}, 32, 82, true, 48}, dense_rows{Buf{}, Buf{}, 32, 82, true, 41};
  EXPECT_TRUE(arena_rows.halves(padded));
  EXPECT_EQ(arena_rows.extent(padded), 48);
  EXPECT_FALSE(dense_rows.halves(dense));
  EXPECT_TRUE(dense_rows.halves(padded));
  EXPECT_THROW(dense_rows.extent(padded), Error);  // a padded activation over a weight without zero rows
  EXPECT_THROW(arena_rows.halves(dense), Error);   // a dense activation over a weight with them
  const Linear plain{Buf{}, Buf{}, 32, 82};         // not gated: one GEMM whatever the rows
  EXPECT_FALSE(plain.halves(padded));
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
