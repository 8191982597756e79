// The trainer end to end on a tiny model and synthetic shards: bit-exact resume for each
// optimizer, checkpoints (atomic, keep_last, incompatible configs refused), non-finite updates,
// evaluation.
#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <sys/stat.h>

#include "multinorm/checkpoint.h"
#include "multinorm/divergence.h"
#include "multinorm/error.h"
#include "multinorm/json_file.h"
#include "multinorm/llama_model.h"
#include "multinorm/trainer.h"
#include "test_util.h"

using namespace multinorm;
using multinorm::testing::TempDir;

namespace {

// Stream shards from a sparse Markov chain over 64 ids (learnable), plus a validation shard.
void write_shards(const std::string& dir) {
  std::mt19937 gen(9);
  for (const std::string name : {"train-0.tok", "train-1.tok", "val-0.tok"}) {
    ShardWriter w(dir + "/" + name, 64, 1, -1, ShardLayout::Stream, 0);
    for (int doc = 0; doc < 40; ++doc) {
      std::vector<int32_t> ids = {static_cast<int32_t>(gen() % 64)};
      for (int t = 0; t < 60; ++t) {
        const int32_t p = ids.back();
        ids.push_back(gen() % 10 < 7 ? (p * 7 + 3) % 64 : static_cast<int32_t>(gen() % 64));
      }
      ids.push_back(1);
      w.add_document(ids);
    }
    w.finish();
  }
}

RunConfig tiny_run(const std::string& dir, const std::string& optimizer, const std::string& out,
                   const std::vector<std::string>& overrides = {}) {
  json j = {
      {"model", {{"config", {{"vocab_size", 64}, {"hidden_size", 32}, {"intermediate_size", 64}, {"num_hidden_layers", 2},
                             {"num_attention_heads", 2}, {"max_position_embeddings", 32}}}}},
      {"data", {{"train", dir + "/train-*.tok"}, {"validation", dir + "/val-*.tok"}, {"layout", "stream"}, {"prefetch", 2}}},
      {"batch", {{"global_batch", 8}, {"micro_batch", 4}, {"seq_len", 16}}},
      {"optimizer", {{"name", optimizer}, {"rounding", "stochastic"}}},
      {"schedule", {{"total_steps", 8}, {"warmup_steps", 2}}},
      {"eval", {{"every", 4}, {"tokens", 500}}},
      {"checkpoint", {{"every", 2}, {"keep_last", 2}}},
      {"seed", 5},
      {"output_dir", out}};
  return run_config_from_json(j, "test.json", overrides);
}

std::vector<double> losses(const std::string& run_dir) {
  std::vector<double> out;
  std::ifstream in(run_dir + "/metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    const json j = json::parse(line);
    if (j["type"] != "train") continue;
    out.push_back(j["loss"].get<double>());
    // The process's own memory is part of RSS and never all of it (the binary's pages are file-backed).
    EXPECT_GT(j["rss_anon_bytes"].get<int64_t>(), 0) << line;
    EXPECT_LT(j["rss_anon_bytes"].get<int64_t>(), j["rss_bytes"].get<int64_t>()) << line;
  }
  return out;
}

std::string file_bytes(const std::string& path) { return read_text_file(path); }

TrainOptions quiet() {
  TrainOptions o;
  o.quiet = true;
  return o;
}

}  // namespace

class Resume : public ::testing::TestWithParam<std::string> {};

// A run stopped after 4 updates and resumed gives the bits of one that ran straight through.
TEST_P(Resume, TwoNStraightEqualsNPlusResumePlusN) {
  TempDir dir;
  write_shards(dir.path());
  const RunConfig straight = tiny_run(dir.path(), GetParam(), dir.path() + "/straight");
  const TrainResult a = train(straight, quiet());
  EXPECT_EQ(a.updates, 8);
  const RunConfig split = tiny_run(dir.path(), GetParam(), dir.path() + "/split");
  TrainOptions first = quiet();
  first.max_updates = 4;
  EXPECT_EQ(train(split, first).updates, 4);
  TrainOptions second = quiet();
  second.resume = true;
  EXPECT_EQ(train(split, second).updates, 4);
  const auto la = losses(dir.path() + "/straight"), lb = losses(dir.path() + "/split");
  ASSERT_EQ(la.size(), 8u);
  ASSERT_EQ(lb.size(), 8u);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(la[i], lb[i]) << "update " << i + 1;  // bitwise
  const std::string ca = latest_checkpoint(dir.path() + "/straight"), cb = latest_checkpoint(dir.path() + "/split");
  EXPECT_EQ(file_bytes(ca + "/model.safetensors"), file_bytes(cb + "/model.safetensors"));
  EXPECT_EQ(file_bytes(ca + "/optimizer.bin"), file_bytes(cb + "/optimizer.bin"));
  EXPECT_LT(la.back(), la.front());
}

// Resuming with another micro-batch (same global batch) is allowed when it does not change the math:
// under token_mean the same sequences make each update. Under micro_batch_mean it reweighs tokens, so
// it needs --allow-config-change, as does another schedule length (printed, then accepted).
TEST(Resume, MicroBatchAndScheduleChanges) {
  TempDir dir;
  write_shards(dir.path());
  const std::vector<std::string> token_mean = {"batch.loss_normalization=token_mean"};
  train(tiny_run(dir.path(), "adam", dir.path() + "/straight", token_mean), quiet());
  TrainOptions first = quiet();
  first.max_updates = 4;
  train(tiny_run(dir.path(), "adam", dir.path() + "/split", token_mean), first);
  std::vector<std::string> smaller = token_mean;
  smaller.push_back("batch.micro_batch=2");
  TrainOptions resume = quiet();
  resume.resume = true;
  EXPECT_EQ(train(tiny_run(dir.path(), "adam", dir.path() + "/split", smaller), resume).updates, 4);
  const auto la = losses(dir.path() + "/straight"), lb = losses(dir.path() + "/split");
  ASSERT_EQ(lb.size(), 8u);
  // The same updates up to FP32 summation order (and BF16 rounding of the weights): update 5's loss
  // is identical, later ones drift by at most 6.5e-5 relative (measured); asserted 1e-3.
  EXPECT_EQ(lb[4], la[4]);
  for (int i = 0; i < 8; ++i) EXPECT_NEAR(lb[i], la[i], 1e-3 * la[i]) << "update " << i + 1;
  // micro_batch_mean: refused, naming the key; accepted with --allow-config-change.
  first.max_updates = 2;
  train(tiny_run(dir.path(), "adam", dir.path() + "/mbm"), first);
  multinorm::testing::expect_error<ConfigError>([&] { train(tiny_run(dir.path(), "adam", dir.path() + "/mbm", {"batch.micro_batch=2"}), resume); },
                            {"batch.micro_batch: 4 -> 2"});
  multinorm::testing::expect_error<ConfigError>([&] { train(tiny_run(dir.path(), "adam", dir.path() + "/mbm", {"schedule.total_steps=12"}), resume); },
                            {"schedule.total_steps: 8 -> 12"});
  TrainOptions allow = resume;
  allow.allow_config_change = true;
  EXPECT_EQ(train(tiny_run(dir.path(), "adam", dir.path() + "/mbm", {"schedule.total_steps=12"}), allow).updates, 10);
}

// An update's step_s holds its own micro-batches. The loop queues update k + 1's before it settles
// k, which on the CPU runs them then: without the correction the first update held two updates'
// forward and backward and the last none (its step_s under its own last micro-batch's forward).
// The run's update_s is still their sum.
TEST(Trainer, EachUpdatesStepTimeHoldsItsOwnMicroBatches) {
  TempDir dir;
  write_shards(dir.path());
  const std::string out = dir.path() + "/run";
  const TrainResult result = train(tiny_run(dir.path(), "sinkgd", out, {"checkpoint.every=0", "eval.every=0"}), quiet());
  std::ifstream in(out + "/metrics.jsonl");
  std::string line;
  double sum = 0;
  int updates = 0;
  while (std::getline(in, line)) {
    const json j = json::parse(line);
    if (j["type"] != "train") continue;
    const double step = j["step_s"].get<double>(), own = j["forward_s"].get<double>() + j["backward_s"].get<double>();
    EXPECT_GE(step, own) << line;
    sum += step, ++updates;
  }
  EXPECT_EQ(updates, 8);
  EXPECT_NEAR(sum, result.update_seconds, 1e-9 * sum);
}

// A checkpoint is compared with the settings its run uses: a SinkGD run resumes after SWAN's
// ns_steps changed (a default that moved between versions), a SWAN run is refused naming the key.
TEST(ResumeSettings, AnUnusedOptimizersSettingsDoNotStopAResume) {
  TempDir dir;
  write_shards(dir.path());
  TrainOptions first = quiet(), resume = quiet();
  first.max_updates = 2;
  resume.resume = true;
  for (const std::string opt : {"sinkgd", "swan"}) {
    const std::string out = dir.path() + "/" + opt;
    train(tiny_run(dir.path(), opt, out, {"optimizer.swan.ns_steps=30"}), first);
    if (opt == "sinkgd") {
      EXPECT_EQ(train(tiny_run(dir.path(), opt, out, {"optimizer.swan.ns_steps=12"}), resume).updates, 6);
    } else {
      multinorm::testing::expect_error<ConfigError>([&] { train(tiny_run(dir.path(), opt, out, {"optimizer.swan.ns_steps=12"}), resume); },
                                                    {"optimizer.swan.ns_steps: 30 -> 12", "--allow-config-change"});
    }
  }
  // A checkpoint of an earlier multinorm, whose fingerprint holds every optimizer's settings.
  const RunConfig sinkgd = tiny_run(dir.path(), "sinkgd", dir.path() + "/x");
  json stored = json::parse(config_fingerprint(sinkgd));
  ASSERT_FALSE(stored["optimizer"].contains("swan"));
  stored["optimizer"]["swan"] = {{"ns_steps", 30}};
  EXPECT_TRUE(fingerprint_diff(stored.dump(), config_fingerprint(sinkgd)).empty());
  stored["optimizer"]["sinkgd"]["iterations"] = 3;
  EXPECT_EQ(fingerprint_diff(stored.dump(), config_fingerprint(sinkgd)), std::vector<std::string>{"optimizer.sinkgd.iterations: 3 -> 5"});
  // A key gone from a section the run uses still counts; a SinkGD checkpoint resumed as SWAN names
  // the optimizer, not each SWAN setting its fingerprint never held.
  stored["optimizer"]["sinkgd"]["iterations"] = 5;
  stored["optimizer"]["sinkgd"]["retired"] = 1;
  EXPECT_EQ(fingerprint_diff(stored.dump(), config_fingerprint(sinkgd)), std::vector<std::string>{"optimizer.sinkgd.retired: 1 -> (unset)"});
  const RunConfig swan = tiny_run(dir.path(), "swan", dir.path() + "/x");
  EXPECT_EQ(fingerprint_diff(config_fingerprint(sinkgd), config_fingerprint(swan)),
            std::vector<std::string>{"optimizer.name: \"sinkgd\" -> \"swan\""});
}

INSTANTIATE_TEST_SUITE_P(Optimizers, Resume, ::testing::Values("sinkgd", "swan", "adam", "adamw", "sgd"));

TEST(Trainer, CheckpointsAreAtomicKeptAndCheckedForCompatibility) {
  TempDir dir;
  write_shards(dir.path());
  const std::string out = dir.path() + "/run";
  train(tiny_run(dir.path(), "sinkgd", out), quiet());
  // keep_last = 2: steps 6 and 8 remain.
  struct stat st {};
  EXPECT_NE(::stat((out + "/checkpoints/step_00000004").c_str(), &st), 0);
  EXPECT_EQ(::stat((out + "/checkpoints/step_00000006").c_str(), &st), 0);
  EXPECT_EQ(latest_checkpoint(out), out + "/checkpoints/step_00000008");
  // A half-written checkpoint (killed mid-write) is never taken for the latest.
  ::mkdir((out + "/checkpoints/step_00000009.tmp").c_str(), 0755);
  EXPECT_EQ(latest_checkpoint(out), out + "/checkpoints/step_00000008");
  const json ts = read_json_file(out + "/checkpoints/step_00000008/trainer_state.json");
  EXPECT_EQ(ts["step"], 8);
  EXPECT_EQ(ts["tokens_seen"], 8 * 8 * 16);
  // Training into a directory with checkpoints needs --resume; another optimizer is refused.
  EXPECT_THROW(train(tiny_run(dir.path(), "sinkgd", out), quiet()), Error);
  TrainOptions resume = quiet();
  resume.resume = true;
  try {
    train(tiny_run(dir.path(), "adam", out), resume);
    FAIL() << "expected a refusal";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("optimizer.name: \"sinkgd\" -> \"adam\""), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--allow-config-change"), std::string::npos) << e.what();
  }
  // The checkpoint is self-sufficient: it carries the run config eval and generate read.
  EXPECT_EQ(read_json_file(latest_checkpoint(out) + "/run_config.json"), tiny_run(dir.path(), "sinkgd", out).resolved);
  EXPECT_EQ(checkpoint_run_config_path(latest_checkpoint(out)), latest_checkpoint(out) + "/run_config.json");
  // Other shapes: the model's own check names the field.
  RunConfig wide = tiny_run(dir.path(), "sinkgd", out);
  wide.model.hidden_size = 64;
  auto be = make_cpu_backend(1);
  LlamaModel m(*be, wide.model, DType::BF16, 1, 4);
  EXPECT_THROW(read_checkpoint(latest_checkpoint(out), m.store(), nullptr, wide), ConfigError);
}

// Non-finite updates: the device skips them (nothing applied), and divergence.action says what the
// run does: stop at the first, or skip at most max_consecutive_skips in a row.
TEST(NonFinite, UpdatesStopTheRunOrAreSkipped) {
  TempDir dir;
  write_shards(dir.path());
  RunConfig run = tiny_run(dir.path(), "sgd", dir.path() + "/nan");
  run.optimizer.fallback = OptimizerKind::Sgd;
  run.optimizer.lr = 1e30;  // weights explode after the first update
  run.schedule.warmup_steps = 0;
  try {
    train(run, quiet());
    FAIL() << "expected an error";
  } catch (const DivergenceError& e) {  // the divergence monitor's stop: exit status 3 from the CLI
    EXPECT_NE(std::string(e.what()).find("update 2 diverged: non-finite loss"), std::string::npos) << e.what();
  }
  // Skipping: the exploded weights make every later update non-finite, so the run stops after
  // max_consecutive_skips of them, naming the update, and is never reported complete.
  run.output_dir = dir.path() + "/skip";
  run.divergence.action = DivergenceAction::Skip;
  run.divergence.max_consecutive_skips = 3;
  try {
    train(run, quiet());
    FAIL() << "expected an error";
  } catch (const DivergenceError& e) {
    EXPECT_NE(std::string(e.what()).find("update 4 diverged: 3 consecutive skipped updates"), std::string::npos) << e.what();
  }
  // result.json says it diverged (never complete), at which update and why.
  const json res = read_json_file(run.output_dir + "/result.json");
  EXPECT_TRUE(res["diverged"].get<bool>());
  EXPECT_EQ(res["divergence"]["step"].get<int64_t>(), 4);
  // A generous limit lets the run skip to its end: complete, with every skip counted and recorded.
  run.output_dir = dir.path() + "/skip-all";
  run.divergence.max_consecutive_skips = 100;
  const TrainResult r = train(run, quiet());
  EXPECT_EQ(r.updates, 8);
  EXPECT_EQ(r.skipped, 7);
  int64_t skip_lines = 0;
  std::ifstream in(run.output_dir + "/metrics.jsonl");
  for (std::string line; std::getline(in, line);)
    if (json::parse(line).value("action", "") == "skip") ++skip_lines;
  EXPECT_EQ(skip_lines, 7);
}

// A divergence rollback, the trip seen while the next update's micro-batches are already queued:
// lr 1e6 from update 4's checkpoint: update 5 is applied and blows the weights up, update 6's loss
// trips; the rollback to update 4 with lr x 1e-9 completes: 5 updates recorded by this run (5, then
// 5-8 again), one divergence line naming the update rolled back to, each update's line once.
TEST(Trainer, ARollbackGoesOnFromTheLastGoodCheckpoint) {
  TempDir dir;
  write_shards(dir.path());
  const std::string out = dir.path() + "/run";
  TrainOptions first = quiet();
  first.max_updates = 4;
  train(tiny_run(dir.path(), "adam", out), first);
  TrainOptions resume = quiet();
  resume.resume = true;
  resume.allow_config_change = true;
  const TrainResult r = train(
      tiny_run(dir.path(), "adam", out, {"optimizer.lr=1e6", "divergence.action=rollback", "divergence.rollback_lr_factor=1e-9"}), resume);
  EXPECT_EQ(r.updates, 5);
  EXPECT_EQ(read_json_file(out + "/result.json")["rollbacks"].get<int64_t>(), 1);
  std::vector<int64_t> steps;
  std::vector<json> trips;
  std::ifstream in(out + "/metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const json j = json::parse(line);
    if (j["type"] == "train") steps.push_back(j["step"].get<int64_t>());
    if (j["type"] == "divergence") trips.push_back(j);
  }
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8}));
  ASSERT_EQ(trips.size(), 1u);
  EXPECT_EQ(trips[0]["action"], "rollback");
  EXPECT_EQ(trips[0]["rolled_back_to"], 4);
  EXPECT_EQ(read_json_file(latest_checkpoint(out) + "/trainer_state.json")["lr_scale"].get<double>(), 1e-9);
}

TEST(Trainer, EvaluationMatchesAFreshEvaluationOfTheCheckpoint) {
  TempDir dir;
  write_shards(dir.path());
  const RunConfig run = tiny_run(dir.path(), "adam", dir.path() + "/run");
  const TrainResult r = train(run, quiet());
  ASSERT_GT(r.eval.batches, 0);
  EXPECT_GE(r.eval.tokens, 500);
  EXPECT_NEAR(r.eval.galore_loss, r.eval.loss * r.eval.batches / (r.eval.batches + 1), 1e-12);
  auto be = make_cpu_backend(2);
  LlamaModel model(*be, run.model, run.precision.params, run.eval.micro_batch, run.batch.seq_len);
  read_checkpoint(latest_checkpoint(run.output_dir), model.store(), nullptr, run);
  auto val = std::make_shared<const ShardSet>(std::vector<std::string>{dir.path() + "/val-0.tok"}, 16, 64);
  const EvalResult again = evaluate(model, val, run.eval.micro_batch, run.eval.tokens);
  EXPECT_EQ(again.loss, r.eval.loss);
  EXPECT_LT(r.eval.perplexity(), 64.0);  // better than uniform over the 64 ids
}
