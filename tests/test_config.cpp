// Run and model config validation: every error names the file and key and says what was expected.
#include <gtest/gtest.h>

#include <dirent.h>

#include "multinorm/cli.h"
#include "multinorm/error.h"
#include "multinorm/json_file.h"
#include "multinorm/run_config.h"
#include "test_util.h"

using namespace multinorm;
using multinorm::testing::TempDir;

namespace {

const char* kTinyModel = R"({"vocab_size": 512, "hidden_size": 64, "intermediate_size": 172,
  "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 256})";

void expect_config_error(const std::function<void()>& fn, const std::vector<std::string>& parts) {
  multinorm::testing::expect_error<ConfigError>(fn, parts);
}

struct RunFixture : ::testing::Test {
  TempDir dir;
  std::string model_path;
  void SetUp() override { model_path = dir.write("tiny.json", kTinyModel); }
  std::string run(const std::string& body) {
    return dir.write("run.json", R"({"model": {"config": "tiny.json"})" + (body.empty() ? "" : ", " + body) + "}");
  }
};

}  // namespace

TEST_F(RunFixture, DefaultsFillEveryKey) {
  const RunConfig c = load_run_config(run(""));
  EXPECT_EQ(c.name, "run");
  EXPECT_EQ(choice_name(c.optimizer.name), "sinkgd");
  EXPECT_EQ(choice_name(c.optimizer.fallback), "adam");
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 0.02);
  EXPECT_DOUBLE_EQ(c.optimizer.alpha, 0.05);
  EXPECT_EQ(c.optimizer.sinkgd.iterations, 5);
  EXPECT_EQ(c.optimizer.matrix_params.size(), 7u);
  EXPECT_EQ(c.batch.global_batch, 512);
  EXPECT_EQ(c.batch.seq_len, 256);
  EXPECT_EQ(c.schedule.total_steps, 10000);
  EXPECT_EQ(c.schedule.warmup_steps, 1000);  // warmup_ratio 0.1 of 10000
  EXPECT_EQ(c.precision.params, DType::BF16);
  EXPECT_EQ(c.eval.micro_batch, c.batch.micro_batch);
  EXPECT_EQ(c.output_dir, "runs/run");
  EXPECT_EQ(c.model.hidden_size, 64);
  // Every schema key is present in the resolved config.
  for (const auto& k : run_schema().keys()) {
    const json* node = &c.resolved;
    size_t start = 0;
    while (true) {
      const size_t dot = k.path.find('.', start);
      const std::string seg = k.path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
      ASSERT_TRUE(node->contains(seg)) << k.path;
      node = &(*node)[seg];
      if (dot == std::string::npos) break;
      start = dot + 1;
    }
  }
}

TEST_F(RunFixture, SeqLenAboveModelLimitIsRejected) {
  // The tiny model allows 256 positions.
  expect_config_error([&] { load_run_config(run(R"("batch": {"seq_len": 512})")); },
                      {"batch.seq_len", "512 exceeds the model's max_position_embeddings 256"});
}

TEST_F(RunFixture, ResolvedConfigIsSelfContainedAndStable) {
  const RunConfig a = load_run_config(run(R"("batch": {"seq_len": 64}, "optimizer": {"name": "swan"})"));
  // The resolved config inlines the model, so it validates on its own from any directory and
  // resolves to itself.
  const std::string copy = dir.write("resolved.json", a.resolved.dump(2));
  const RunConfig b = load_run_config(copy);
  EXPECT_EQ(a.resolved.dump(), b.resolved.dump());
  EXPECT_EQ(b.model.hidden_size, 64);
  EXPECT_EQ(choice_name(b.optimizer.name), "swan");
}

TEST_F(RunFixture, UnknownKeyNamesFileAndPath) {
  const std::string p = run(R"("batch": {"seq_len": 64}, "colour": 1)");
  expect_config_error([&] { load_run_config(p); }, {p, "colour", "unknown key"});
}

TEST_F(RunFixture, TypoGetsSuggestion) {
  const std::string p = run(R"("batch": {"seq_len": 64}, "optimizer": {"lrr": 0.1})");
  expect_config_error([&] { load_run_config(p); }, {p, "optimizer.lrr", "did you mean 'optimizer.lr'?"});
  const std::string q = run(R"("batch": {"seq_len": 64, "micro_bach": 4})");
  expect_config_error([&] { load_run_config(q); }, {"batch.micro_bach", "did you mean 'batch.micro_batch'?"});
  // A key in the wrong section is found by its last segment.
  const std::string r = run(R"("batch": {"seq_len": 64}, "warmup_steps": 10)");
  expect_config_error([&] { load_run_config(r); }, {"did you mean 'schedule.warmup_steps'?"});
}

TEST_F(RunFixture, WrongTypeSaysWhatWasExpected) {
  expect_config_error([&] { load_run_config(run(R"("batch": {"seq_len": "long"})")); },
                      {"batch.seq_len", "expected an integer", "got string \"long\""});
  expect_config_error([&] { load_run_config(run(R"("batch": {"seq_len": 64.5})")); }, {"batch.seq_len", "integer"});
  expect_config_error([&] { load_run_config(run(R"("batch": {"seq_len": 64}, "data": {"shuffle": 1})")); },
                      {"data.shuffle", "true or false"});
  expect_config_error([&] { load_run_config(run(R"("batch": 3)")); }, {"batch", "expected a section"});
  expect_config_error([&] { load_run_config(run(R"("batch": {"seq_len": 64}, "optimizer": {"name": "sinkhorn"})")); },
                      {"optimizer.name", "one of sinkgd, swan, adam, adamw, sgd"});
  expect_config_error([&] { load_run_config(run(R"("batch": {"seq_len": 64}, "optimizer": {"name": "adamm"})")); },
                      {"did you mean 'adam'?"});
  // 1e4 is an integer written as a float: accepted.
  EXPECT_EQ(load_run_config(run(R"("batch": {"seq_len": 64}, "schedule": {"total_steps": 1e4})")).schedule.total_steps, 10000);
}

TEST_F(RunFixture, OutOfRangeValues) {
  expect_config_error([&] { load_run_config(run(R"("batch": {"seq_len": 64}, "optimizer": {"lr": 0})")); },
                      {"optimizer.lr", "> 0"});
  expect_config_error([&] { load_run_config(run(R"("batch": {"seq_len": 64, "micro_batch": 0})")); },
                      {"batch.micro_batch", "integer [1, 1048576]", "got integer 0"});
  expect_config_error([&] { load_run_config(run(R"("batch": {"seq_len": 64}, "schedule": {"warmup_ratio": 1.5})")); },
                      {"schedule.warmup_ratio", "[0, 1]"});
  // Adam's betas stay below 1: the bias correction divides by 1 - beta^t.
  expect_config_error([&] { load_run_config(run(R"("batch": {"seq_len": 64}, "optimizer": {"adam": {"beta1": 1}})")); },
                      {"optimizer.adam.beta1", "expected number [0, 1)", "got integer 1"});
  expect_config_error([&] { load_run_config(run(R"("batch": {"seq_len": 64}, "optimizer": {"adam": {"beta2": 1.0}})")); },
                      {"optimizer.adam.beta2", "[0, 1)"});
  EXPECT_NO_THROW(load_run_config(run(R"("batch": {"seq_len": 64}, "optimizer": {"adam": {"beta2": 0.9999}})")));
}

TEST_F(RunFixture, CrossKeyChecks) {
  expect_config_error([&] { load_run_config(run(R"("batch": {"seq_len": 64, "global_batch": 10, "micro_batch": 4})")); },
                      {"batch.global_batch", "not a multiple of batch.micro_batch 4"});
  expect_config_error([&] { load_run_config(run(R"("batch": {"seq_len": 64}, "schedule": {"total_steps": 10, "warmup_steps": 20})")); },
                      {"schedule.warmup_steps", "exceeds"});
}

TEST_F(RunFixture, Overrides) {
  const std::string p = run(R"("batch": {"seq_len": 64})");
  const RunConfig c = load_run_config(p, {"optimizer.lr=0.01", "optimizer.name=swan", "data.shuffle=false",
                                          "optimizer.matrix_params=[\"*q_proj*\"]", "output_dir=out/x"});
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 0.01);
  EXPECT_EQ(choice_name(c.optimizer.name), "swan");
  EXPECT_FALSE(c.data.shuffle);
  ASSERT_EQ(c.optimizer.matrix_params.size(), 1u);
  EXPECT_EQ(c.output_dir, "out/x");
  expect_config_error([&] { load_run_config(p, {"optimizer.lr=abc"}); },
                      {"--set optimizer.lr=abc", "expected a number", "got string \"abc\""});
  expect_config_error([&] { load_run_config(p, {"optimizer.lrr=0.1"}); },
                      {"--set optimizer.lrr=0.1", "unknown key 'optimizer.lrr'", "did you mean 'optimizer.lr'?"});
  expect_config_error([&] { load_run_config(p, {"optimizer.lr"}); }, {"expected key=value"});
  expect_config_error([&] { load_run_config(p, {"batch.micro_batch=-3"}); }, {"--set batch.micro_batch=-3", "integer [1, 1048576]"});
}

TEST_F(RunFixture, MissingAndMalformedFiles) {
  expect_config_error([&] { load_run_config(dir.path() + "/nope.json"); }, {"nope.json", "cannot open"});
  const std::string bad = dir.write("bad.json", "{\n  \"batch\": {\"seq_len\": 64,}\n}\n");
  expect_config_error([&] { load_run_config(bad); }, {"bad.json:2:", "invalid JSON"});
  const std::string missing_model = dir.write("m.json", R"({"model": {"config": "absent.json"}})");
  expect_config_error([&] { load_run_config(missing_model); }, {"m.json", "model.config", "absent.json", "cannot open"});
  const std::string no_model = dir.write("n.json", R"({"seed": 3})");
  expect_config_error([&] { load_run_config(no_model); }, {"model.config", "required"});
  expect_config_error([&] { load_run_config(model_path); }, {"this is a model config"});
}

TEST(ModelConfig, ValidatesShapesAndHfFields) {
  TempDir dir;
  expect_config_error([&] { load_model_config(dir.write("a.json", R"({"vocab_size": 10, "hidden_size": 65,
      "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 4})")); },
                      {"a.json", "num_attention_heads", "not divisible"});
  expect_config_error([&] { load_model_config(dir.write("b.json", R"({"vocab_size": 10, "hidden_size": 64,
      "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2})")); },
                      {"num_key_value_heads", "grouped-query"});
  expect_config_error([&] { load_model_config(dir.write("c.json", R"({"vocab_size": 10, "hidden_size": 64,
      "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 4, "hidden_act": "gelu"})")); },
                      {"hidden_act", "one of silu"});
  expect_config_error([&] { load_model_config(dir.write("d.json", R"({"vocab_size": 10, "hidden_size": 64,
      "intermediate_size": 8, "num_attention_heads": 4})")); },
                      {"num_hidden_layers", "required"});
  expect_config_error([&] { load_model_config(dir.write("e.json", R"({"vocab_size": 10, "hidden_sise": 64})")); },
                      {"hidden_sise", "did you mean 'hidden_size'?"});
  // A GaLore-style config with HF informational fields loads.
  const ModelConfig m = load_model_config(dir.write("galore.json", R"({"architectures": ["LLaMAForCausalLM"],
      "bos_token_id": 0, "eos_token_id": 1, "hidden_act": "silu", "hidden_size": 512, "intermediate_size": 1376,
      "initializer_range": 0.02, "max_sequence_length": 1024, "model_type": "llama", "num_attention_heads": 8,
      "num_hidden_layers": 8, "pad_token_id": -1, "rms_norm_eps": 1e-06, "transformers_version": "4.28.1",
      "use_cache": true, "vocab_size": 32000})"));
  EXPECT_EQ(m.head_dim(), 64);
  EXPECT_EQ(m.name, "galore");
}

TEST(Configs, ShippedConfigsAllValidate) {
  int n = 0;
  for (const std::string sub : {"/models", "/c4", ""}) {
    const std::string dir = std::string(MULTINORM_CONFIGS_DIR) + sub;
    DIR* d = ::opendir(dir.c_str());
    ASSERT_NE(d, nullptr) << dir;
    while (dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name.size() < 5 || name.substr(name.size() - 5) != ".json") continue;
      const std::string path = dir + "/" + name;
      const json doc = read_json_file(path);
      if (is_model_config(doc)) {
        EXPECT_NO_THROW(load_model_config(path)) << path;
      } else if (doc.contains("model")) {
        EXPECT_NO_THROW(load_run_config(path)) << path;
      }
      ++n;
    }
    ::closedir(d);
  }
  EXPECT_GE(n, 7 + 12);
}

TEST(Configs, PaperRunConfigsHoldThePapersHyperparameters) {
  const std::string dir = std::string(MULTINORM_CONFIGS_DIR) + "/c4/";
  const RunConfig s = load_run_config(dir + "llama_60m_sinkgd.json");
  EXPECT_EQ(choice_name(s.optimizer.name), "sinkgd");
  EXPECT_DOUBLE_EQ(s.optimizer.lr, 0.02);
  EXPECT_DOUBLE_EQ(s.optimizer.alpha, 0.05);
  EXPECT_EQ(s.optimizer.sinkgd.iterations, 5);
  EXPECT_EQ(s.batch.global_batch * s.batch.seq_len, 131072);
  EXPECT_EQ(s.schedule.total_steps, 10000);
  EXPECT_EQ(s.schedule.warmup_steps, 1000);
  EXPECT_TRUE(s.schedule.galore_offset);  // GaLore's scheduler: update k at mult(k - 1)
  EXPECT_EQ(s.backend, BackendRequest::Cuda);
  EXPECT_DOUBLE_EQ(s.optimizer.grad_clip, 0.0);
  EXPECT_DOUBLE_EQ(s.optimizer.weight_decay, 0.0);
  EXPECT_EQ(load_run_config(dir + "llama_1b_adam.json").optimizer.lr, 7e-4);
  EXPECT_EQ(load_run_config(dir + "llama_350m_adam.json").schedule.total_steps, 60000);
  // The paper's batch shapes: 60M 256 x 2; 130M and 350M 128 x 4 on one GPU; 1B 32 per GPU x 2 on 8.
  const std::vector<std::pair<std::string, int64_t>> micro = {{"60m", 256}, {"130m", 128}, {"350m", 128}, {"1b", 32}};
  for (const auto& [size, mb] : micro)
    for (const std::string opt : {"adam", "sinkgd", "swan", "swan_dagger"}) {
      const RunConfig c = load_run_config(dir + "llama_" + size + "_" + opt + ".json");
      EXPECT_EQ(c.batch.micro_batch, mb) << size << " " << opt;
      EXPECT_TRUE(c.schedule.galore_offset) << size << " " << opt;
      EXPECT_GT(c.resolved["paper"]["perplexity"].get<double>(), 0) << size << " " << opt;
    }
  // SWAN's two rows: SWAN (cited: no warm-up, Adam's learning rate everywhere) and SWAN† (warm-up,
  // the tuned 0.02 with alpha 0.05), with their Table 1 figures.
  const RunConfig swan = load_run_config(dir + "llama_60m_swan.json"), dagger = load_run_config(dir + "llama_60m_swan_dagger.json");
  EXPECT_EQ(swan.schedule.warmup_steps, 0);
  EXPECT_DOUBLE_EQ(swan.optimizer.lr * swan.optimizer.alpha, 1e-3);
  EXPECT_EQ(swan.resolved["paper"]["row"], "SWAN");
  EXPECT_DOUBLE_EQ(swan.resolved["paper"]["perplexity"].get<double>(), 32.28);
  EXPECT_EQ(dagger.schedule.warmup_steps, 1000);
  EXPECT_DOUBLE_EQ(dagger.optimizer.lr, 0.02);
  EXPECT_EQ(dagger.resolved["paper"]["row"], "SWAN†");
  EXPECT_DOUBLE_EQ(dagger.resolved["paper"]["perplexity"].get<double>(), 30.00);
  EXPECT_DOUBLE_EQ(load_run_config(dir + "llama_1b_sinkgd.json").resolved["paper"]["perplexity"].get<double>(), 13.51);
  EXPECT_EQ(load_run_config(dir + "llama_7b_sinkgd.json").model.hidden_size, 4096);
}

#include "multinorm/paper_figures.h"

TEST(Configs, PaperFigureFollowsTheRecipe) {
  const std::string dir = std::string(MULTINORM_CONFIGS_DIR) + "/c4/";
  const auto figure = [&](const std::string& file, const std::vector<std::string>& set) {
    return paper_figure(load_run_config(dir + file, set).resolved);
  };
  ASSERT_TRUE(figure("llama_60m_sinkgd.json", {}).has_value());
  EXPECT_DOUBLE_EQ(figure("llama_60m_sinkgd.json", {})->perplexity, 30.99);
  EXPECT_EQ(figure("llama_60m_sinkgd.json", {})->row, "SinkGD");
  // How the batch is split, where the data is, the seed and the backend do not change the recipe...
  const auto split = figure("llama_60m_sinkgd.json", {"batch.micro_batch=32", "seed=7", "backend=cpu", "data.train=x/*.tok", "name=other"});
  ASSERT_TRUE(split.has_value());
  EXPECT_DOUBLE_EQ(split->perplexity, 30.99);
  // ... the learning rate, the schedule and the model do.
  EXPECT_FALSE(figure("llama_60m_sinkgd.json", {"optimizer.lr=0.01"}).has_value());
  EXPECT_FALSE(figure("llama_60m_sinkgd.json", {"schedule.total_steps=5000"}).has_value());
  EXPECT_FALSE(figure("llama_60m_sinkgd.json", {"model.config=llama_130m"}).has_value());
  EXPECT_FALSE(figure("llama_60m_adam.json", {"optimizer.lr=0.005"}).has_value());
  // ... and the settings of the optimizers the run uses, not another's (a run directory of a version
  // whose SWAN default differed is still SinkGD's row).
  EXPECT_TRUE(figure("llama_60m_sinkgd.json", {"optimizer.swan.ns_steps=30"}).has_value());
  EXPECT_FALSE(figure("llama_60m_sinkgd.json", {"optimizer.sinkgd.iterations=3"}).has_value());
  EXPECT_FALSE(figure("llama_60m_sinkgd.json", {"optimizer.adam.beta2=0.99"}).has_value());  // its fallback's
  EXPECT_DOUBLE_EQ(figure("llama_130m_swan_dagger.json", {})->perplexity, 22.83);
  EXPECT_FALSE(figure("llama_7b_sinkgd.json", {}).has_value());  // no paper figure for it
}

TEST(Configs, ReferenceDocIsInSyncWithTheSchema) {
  // docs/configs.md is generated: `multinorm config --reference > docs/configs.md`.
  const std::string doc = read_text_file(std::string(MULTINORM_DOCS_DIR) + "/configs.md");
  EXPECT_EQ(doc, config_reference_markdown()) << "regenerate docs/configs.md with: multinorm config --reference";
}

TEST(Schema, EditDistanceAndOverrideParsing) {
  EXPECT_EQ(edit_distance("lrr", "lr"), 1u);
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
  auto [k1, v1] = parse_override("optimizer.lr=1e-3");
  EXPECT_EQ(k1, "optimizer.lr");
  EXPECT_TRUE(v1.is_number());
  auto [k2, v2] = parse_override("optimizer.name=swan");
  EXPECT_EQ(v2, "swan");
  auto [k3, v3] = parse_override("name=a=b");
  EXPECT_EQ(k3, "name");
  EXPECT_EQ(v3, "a=b");
}

#include "multinorm/sweep.h"

TEST(Configs, PaperSweepListsTheSixteenRunsOfTable1) {
  const SweepPlan plan = load_sweep(std::string(MULTINORM_CONFIGS_DIR) + "/sweeps/paper_table1.json");
  ASSERT_EQ(plan.runs.size(), 16u);
  for (const SweepRun& r : plan.runs) {  // each run is its shipped config, with the paper's figure
    const RunConfig c = load_run_config(r.config, r.overrides);
    EXPECT_EQ(c.name, r.name);
    ASSERT_TRUE(paper_figure(c.resolved).has_value()) << r.name;
    EXPECT_EQ(paper_figure(c.resolved)->config.substr(paper_figure(c.resolved)->config.rfind('/') + 1), r.name + ".json");
  }
  const RunConfig one_b = load_run_config(plan.runs[12].config, plan.runs[12].overrides);  // llama_1b_adam
  EXPECT_EQ(one_b.model.hidden_size, 2048);
  EXPECT_EQ(one_b.optimizer.name, OptimizerKind::Adam);
  EXPECT_DOUBLE_EQ(one_b.optimizer.lr, 7e-4);
  EXPECT_EQ(one_b.schedule.total_steps, 100000);
  EXPECT_EQ(one_b.schedule.warmup_steps, 10000);
}

TEST(Configs, AdamLearningRateGridsAreThePapers) {
  const std::vector<double> small = {1e-2, 5e-3, 1e-3, 5e-4, 1e-4}, large = {1e-3, 7e-4, 5e-4, 3e-4, 1e-4};
  for (const std::string size : {"60m", "130m", "350m", "1b"}) {
    const SweepPlan plan = load_sweep(std::string(MULTINORM_CONFIGS_DIR) + "/sweeps/adam_lr_grid_" + size + ".json");
    std::vector<double> lrs;
    for (const SweepRun& r : plan.runs) {
      const RunConfig c = load_run_config(r.config, r.overrides);
      EXPECT_EQ(c.optimizer.name, OptimizerKind::Adam) << size;
      EXPECT_EQ(c.model.name, "llama_" + size);
      lrs.push_back(c.optimizer.lr);
    }
    EXPECT_EQ(lrs, size == "1b" ? large : small) << size;
  }
}

TEST(Configs, SweepGpuListsParse) {
  EXPECT_EQ(parse_gpu_list("0-7"), (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(parse_gpu_list("0,1,4-5"), (std::vector<int>{0, 1, 4, 5}));
  EXPECT_EQ(parse_gpu_list("3"), (std::vector<int>{3}));
  expect_config_error([] { parse_gpu_list("0-"); }, {"--gpus 0-", "expected GPU ids"});
  expect_config_error([] { parse_gpu_list("3-1"); }, {"3-1 is empty"});
  expect_config_error([] { parse_gpu_list("0,0"); }, {"GPU 0 twice"});
  expect_config_error([] { parse_gpu_list("a"); }, {"expected GPU ids"});
}

TEST(Configs, SmallOptimizerSweepIsThePapersProtocolWithTheSameTokensForAll) {
  const SweepPlan plan = load_sweep(std::string(MULTINORM_CONFIGS_DIR) + "/sweeps/optimizers_small.json");
  ASSERT_EQ(plan.runs.size(), 4u);
  std::vector<std::string> optimizers;
  std::vector<double> lrs;
  for (const auto& r : plan.runs) {
    const RunConfig run = load_run_config(r.config, r.overrides);
    EXPECT_EQ(run.data.layout, ShardLayout::Rows) << r.name;
    EXPECT_EQ(run.batch.seq_len, 256) << r.name;
    EXPECT_EQ(run.batch.global_batch, 32) << r.name;
    EXPECT_EQ(run.schedule.total_steps, 120) << r.name;
    EXPECT_EQ(run.model.hidden_size, 256) << r.name;  // llama_tiny
    optimizers.push_back(choice_name(run.optimizer.name));
    lrs.push_back(run.optimizer.lr);
    if (run.optimizer.name == OptimizerKind::SinkGD) {
      EXPECT_DOUBLE_EQ(run.optimizer.alpha, 0.05);
      EXPECT_EQ(run.optimizer.sinkgd.iterations, 5);
    }
  }
  EXPECT_EQ(optimizers, (std::vector<std::string>{"adam", "adam", "sinkgd", "swan"}));
  EXPECT_EQ(lrs, (std::vector<double>{1e-3, 3e-3, 0.02, 0.02}));
}

TEST(Configs, SweepErrorsNameTheKey) {
  TempDir dir;
  dir.write("tiny.json", kTinyModel);
  dir.write("base.json", R"({"model": {"config": "tiny.json"}, "batch": {"seq_len": 64}})");
  expect_config_error([&] { load_sweep(dir.write("s1.json", R"({"base": "base.json", "gird": {}})")); },
                      {"s1.json", "gird", "did you mean 'grid'?"});
  expect_config_error([&] { load_sweep(dir.write("s2.json", R"({"base": "base.json", "grid": {"optimizer.lr": [0.1, "x"]}})")); },
                      {"--set optimizer.lr=x", "expected a number"});
  const SweepPlan p = load_sweep(dir.write("s3.json", R"({"base": "base.json", "grid": {"optimizer.name": ["sinkgd", "adam"],
      "optimizer.lr": [0.1, 0.2]}, "runs": [{"name": "extra", "set": {"seed": 3}}]})"));
  EXPECT_EQ(p.runs.size(), 5u);  // 2 x 2 grid + 1 listed
  // No base: every run names its config (relative to the sweep file), or the sweep is refused.
  expect_config_error([&] { load_sweep(dir.write("s4.json", R"({"runs": [{"name": "a"}]})")); },
                      {"s4.json", "base", "unless every run names its config"});
  const SweepPlan own = load_sweep(dir.write("s5.json", R"({"runs": [{"name": "a", "config": "base.json"}]})"));
  ASSERT_EQ(own.runs.size(), 1u);
  EXPECT_EQ(own.runs[0].config, dir.path() + "/base.json");
  // A model.config path in a sweep file resolves against the sweep file's folder.
  const SweepPlan m = load_sweep(dir.write("s6.json", R"({"base": "base.json", "runs": [{"name": "m", "set": {"model.config": "tiny.json"}}]})"));
  EXPECT_EQ(load_run_config(m.runs[0].config, m.runs[0].overrides).model.hidden_size, load_model_config(dir.path() + "/tiny.json").hidden_size);
}
