// `multinorm compare` on synthetic run directories whose crossing points are known in closed form.
#include <gtest/gtest.h>

#include <cmath>
#include <sys/stat.h>

#include "multinorm/compare.h"
#include "multinorm/json_file.h"
#include "multinorm/run_config.h"
#include "test_util.h"

namespace multinorm {
namespace {

using testing::TempDir;

struct FakeRun {
  std::string optimizer = "adam";
  int64_t seq_len = 256, hidden = 64;
  double tokens_per_step = 1000, step_s = 1.0;
  std::vector<std::pair<int64_t, double>> evals;  // (update, val_loss)
  int64_t updates = 30;
};

// A run directory as the trainer writes it: config.json, metrics.jsonl, result.json.
std::string make_run(const TempDir& tmp, const std::string& name, const FakeRun& f) {
  const std::string dir = tmp.path() + "/" + name;
  ::mkdir(dir.c_str(), 0755);
  const json cfg = {{"model", {{"config", {{"hidden_size", f.hidden}, {"vocab_size", 128}}}}},
                    {"data", {{"train", "t/*.tok"}, {"validation", "v/*.tok"}, {"tokenizer", "tok.model"}, {"layout", "rows"}}},
                    {"batch", {{"global_batch", 4}, {"micro_batch", 2}, {"seq_len", f.seq_len}}},
                    {"eval", {{"tokens", 4096}}},
                    {"optimizer", {{"name", f.optimizer}}}};
  write_text_file_atomic(dir + "/config.json", cfg.dump(2));
  std::string metrics;
  size_t e = 0;
  for (int64_t k = 1; k <= f.updates; ++k) {
    metrics += json{{"type", "train"}, {"step", k}, {"loss", 10.0 - 0.1 * k}, {"tokens", f.tokens_per_step * k},
                    {"step_s", f.step_s}, {"rss_bytes", 1000 * k}}.dump() + "\n";
    if (e < f.evals.size() && f.evals[e].first == k)
      metrics += json{{"type", "eval"}, {"step", k}, {"val_loss", f.evals[e++].second}}.dump() + "\n";
  }
  write_text_file_atomic(dir + "/metrics.jsonl", metrics);
  write_text_file_atomic(dir + "/result.json", json{{"optimizer_state_bytes", 4096}}.dump());
  return dir;
}

Comparison compare(const std::vector<std::string>& dirs, const std::string& ref = "", bool allow = false) {
  std::vector<RunCurve> runs;
  for (const auto& d : dirs) runs.push_back(load_run_curve(d, CompareMetric::ValLoss));
  return compare_runs(std::move(runs), ref, CompareMetric::ValLoss, allow);
}

// A run of a configs/c4 recipe gets the paper's figure beside its own; a changed recipe does not.
TEST(Compare, PrintsThePapersFigureBesideARunOfAPaperRecipe) {
  TempDir tmp;
  FakeRun f;
  f.evals = {{10, 3.5}, {30, 3.4}};
  const std::string paper = make_run(tmp, "paper", f), tuned = make_run(tmp, "tuned", f);
  const std::string c4 = std::string(MULTINORM_CONFIGS_DIR) + "/c4/llama_60m_sinkgd.json";
  write_text_file_atomic(paper + "/config.json", load_run_config(c4, {"batch.micro_batch=32"}).resolved.dump(2));
  write_text_file_atomic(tuned + "/config.json", load_run_config(c4, {"optimizer.lr=0.01"}).resolved.dump(2));
  const auto c = compare({paper, tuned});
  EXPECT_DOUBLE_EQ(c.runs[0].paper_ppl, 30.99);
  EXPECT_EQ(c.runs[0].paper_row, "Table 1, SinkGD");
  EXPECT_EQ(c.runs[1].paper_ppl, 0);
  const std::string md = comparison_markdown(c);
  EXPECT_NE(md.find("| 30.99 (Table 1, SinkGD) |"), std::string::npos) << md;
  EXPECT_NE(comparison_csv(c).find(",30.99,"), std::string::npos);
}

TEST(Compare, InterpolatesTheCrossingAndDerivesSpeedups) {
  TempDir tmp;
  FakeRun adam;  // reaches its own final loss 3.0 at update 30, in 30 s
  adam.evals = {{10, 5.0}, {20, 4.0}, {30, 3.0}};
  FakeRun sinkgd;
  sinkgd.optimizer = "sinkgd", sinkgd.step_s = 2.0;  // crosses 3.0 halfway between updates 20 and 30
  sinkgd.evals = {{10, 4.5}, {20, 3.5}, {30, 2.5}};
  const auto c = compare({make_run(tmp, "adam", adam), make_run(tmp, "sinkgd", sinkgd)});
  ASSERT_EQ(c.reference, 0u);
  EXPECT_EQ(c.target, 3.0);
  const CompareRow& ref = c.rows[0];
  EXPECT_TRUE(ref.crossing.reached);
  EXPECT_DOUBLE_EQ(ref.crossing.steps, 30);
  EXPECT_DOUBLE_EQ(ref.speedup_tokens, 1.0);
  const CompareRow& r = c.rows[1];
  ASSERT_TRUE(r.crossing.reached);
  EXPECT_FALSE(r.crossing.at_first_point);
  // f = (3.5 - 3.0) / (3.5 - 2.5) = 0.5 between updates 20 and 30.
  EXPECT_DOUBLE_EQ(r.crossing.steps, 25);
  EXPECT_DOUBLE_EQ(r.crossing.tokens, 25000);
  EXPECT_DOUBLE_EQ(r.crossing.seconds, 50);  // 2 s per update
  EXPECT_DOUBLE_EQ(r.speedup_steps, 30.0 / 25);
  EXPECT_DOUBLE_EQ(r.speedup_tokens, 30.0 / 25);
  EXPECT_DOUBLE_EQ(r.speedup_time, 30.0 / 50);
  EXPECT_DOUBLE_EQ(r.raw_tokens_per_s, 30000.0 / 60);
  EXPECT_DOUBLE_EQ(r.effective_tokens_per_s, 500 * 1.2);
  EXPECT_EQ(c.runs[1].state_bytes, 4096);
  EXPECT_EQ(c.runs[1].peak_rss_bytes, 30000);
  const std::string csv = comparison_csv(c);
  EXPECT_NE(csv.find("sinkgd,"), std::string::npos);
  EXPECT_NE(csv.find(",25,25000,50,1.2,1.2,0.6,500.0,600,"), std::string::npos) << csv;
  EXPECT_NE(comparison_markdown(c).find("| adam (reference) |"), std::string::npos);
}

TEST(Compare, ARunThatNeverReachesTheTarget) {
  TempDir tmp;
  FakeRun adam;
  adam.evals = {{10, 5.0}, {20, 4.0}, {30, 3.0}};
  FakeRun slow;
  slow.optimizer = "swan";
  slow.evals = {{10, 4.8}, {20, 4.2}, {30, 3.0001}};
  const auto c = compare({make_run(tmp, "adam", adam), make_run(tmp, "slow", slow)});
  EXPECT_FALSE(c.rows[1].crossing.reached);
  EXPECT_EQ(c.rows[1].speedup_tokens, 0);
  EXPECT_EQ(c.rows[1].effective_tokens_per_s, 0);
  EXPECT_NE(comparison_markdown(c).find("not reached"), std::string::npos);
  EXPECT_NE(comparison_csv(c).find("slow,"), std::string::npos);
}

TEST(Compare, BelowTheTargetAtTheFirstEvaluationIsAnUpperBound) {
  TempDir tmp;
  FakeRun adam;
  adam.evals = {{10, 5.0}, {20, 4.0}, {30, 3.0}};
  FakeRun fast;
  fast.optimizer = "sinkgd";
  fast.evals = {{10, 2.9}, {20, 2.5}, {30, 2.0}};
  const auto c = compare({make_run(tmp, "adam", adam), make_run(tmp, "fast", fast)});
  EXPECT_TRUE(c.rows[1].crossing.at_first_point);
  EXPECT_DOUBLE_EQ(c.rows[1].crossing.steps, 10);
  EXPECT_NE(c.rows[1].flags.find("upper bounds"), std::string::npos);
  EXPECT_NE(comparison_markdown(c).find("≤ 10.0"), std::string::npos);
}

TEST(Compare, ReferenceIsTheBestAdamRunUnlessGiven) {
  TempDir tmp;
  FakeRun a1, a2, s;
  a1.evals = {{10, 5.0}, {30, 3.2}};
  a2.evals = {{10, 5.0}, {30, 3.0}};
  s.optimizer = "sinkgd";
  s.evals = {{10, 4.0}, {30, 2.5}};  // lowest of all, but not Adam
  const std::string d1 = make_run(tmp, "adam_lr1", a1), d2 = make_run(tmp, "adam_lr3", a2),
                    d3 = make_run(tmp, "sinkgd", s);
  auto c = compare({d1, d2, d3});
  EXPECT_EQ(c.reference, 1u);
  EXPECT_EQ(c.target, 3.0);
  EXPECT_NE(c.reference_reason.find("Adam"), std::string::npos);
  // The worse Adam run: 3.2 never reaches 3.0.
  EXPECT_FALSE(c.rows[0].crossing.reached);
  c = compare({d1, d2, d3}, d1);  // given
  EXPECT_EQ(c.reference, 0u);
  EXPECT_EQ(c.target, 3.2);
  EXPECT_EQ(c.reference_reason, "given");
  c = compare({d3, d1}, "", false);
  EXPECT_EQ(c.reference, 1u);  // Adam, though sinkgd is lower
  c = compare({d3});           // no Adam run: the lowest loss
  EXPECT_EQ(c.reference, 0u);
  EXPECT_NE(c.reference_reason.find("no Adam run"), std::string::npos);
  testing::expect_error<ConfigError>([&] { compare({d1, d2}, d3); }, {"--reference", "not among the runs"});
}

TEST(Compare, RunsThatDifferInModelOrBatchAreRefusedOrFlagged) {
  TempDir tmp;
  FakeRun adam, other, wide;
  adam.evals = other.evals = wide.evals = {{10, 5.0}, {30, 3.0}};
  other.optimizer = "sinkgd", other.seq_len = 512;
  wide.optimizer = "sinkgd", wide.hidden = 96;
  const std::string a = make_run(tmp, "adam", adam), o = make_run(tmp, "seq512", other), w = make_run(tmp, "wide", wide);
  testing::expect_error<ConfigError>([&] { compare({a, o}); }, {"not comparable", "seq512", "batch.seq_len 512 (reference 256)"});
  testing::expect_error<ConfigError>([&] { compare({a, w}); }, {"model.config.hidden_size 96 (reference 64)"});
  const auto c = compare({a, o}, "", true);
  EXPECT_NE(c.rows[1].flags.find("NOT COMPARABLE: batch.seq_len"), std::string::npos);
  EXPECT_TRUE(c.rows[0].flags.empty());
  // A sweep over several models compares within each.
  std::vector<RunCurve> runs;
  for (const auto& d : {a, w, o, a}) runs.push_back(load_run_curve(d, CompareMetric::ValLoss));
  const auto groups = group_comparable(std::move(runs));
  ASSERT_EQ(groups.size(), 3u);
  EXPECT_EQ(groups[0].size(), 2u);
}

TEST(Compare, ResumedRunsCountEachUpdateOnceAndACutLastLineIsTolerated) {
  TempDir tmp;
  FakeRun adam;
  adam.evals = {{10, 5.0}, {20, 4.0}, {30, 3.0}};
  const std::string d = make_run(tmp, "adam", adam);
  // A crash after update 25 and a resume from the checkpoint at 20: updates 21..25 are written again
  // (slower this time), and the crash cut a line short.
  std::string again;
  for (int k = 21; k <= 25; ++k)
    again += json{{"type", "train"}, {"step", k}, {"loss", 1.0}, {"tokens", 1000.0 * k}, {"step_s", 3.0}}.dump() + "\n";
  std::string text = read_text_file(d + "/metrics.jsonl");
  const auto at26 = text.find("\"step\":26,");
  ASSERT_NE(at26, std::string::npos);
  const auto cut = text.rfind('\n', at26) + 1;  // the start of update 26's record
  text = text.substr(0, cut) + again + text.substr(cut);
  write_text_file_atomic(d + "/metrics.jsonl", text + "{\"type\":\"train\",\"st");
  const RunCurve r = load_run_curve(d, CompareMetric::ValLoss);
  EXPECT_EQ(r.updates, 30);
  EXPECT_EQ(r.missing_updates, 0);
  EXPECT_DOUBLE_EQ(r.total_seconds, 25 * 1.0 + 5 * 3.0);  // 21..25 timed by their last record
  ASSERT_EQ(r.seconds.size(), 3u);
  EXPECT_DOUBLE_EQ(r.seconds[1], 20);
  EXPECT_DOUBLE_EQ(r.seconds[2], 40);
  // A damaged record elsewhere is an error naming the line.
  write_text_file_atomic(d + "/metrics.jsonl", "{\"type\":\"train\"}\nnot json\n" + text);
  testing::expect_error<ConfigError>([&] { load_run_curve(d, CompareMetric::ValLoss); }, {"metrics.jsonl:1", "train record"});
  write_text_file_atomic(d + "/metrics.jsonl", "not json\n" + text);
  testing::expect_error<ConfigError>([&] { load_run_curve(d, CompareMetric::ValLoss); }, {"metrics.jsonl:1", "not a JSON record"});
  testing::expect_error<ConfigError>([&] { load_run_curve(tmp.path() + "/nothing", CompareMetric::ValLoss); },
                                     {"nothing", "not a multinorm run directory"});
}

TEST(Compare, TrainLossIsATrailingMean) {
  TempDir tmp;
  FakeRun adam;  // training loss 10 - 0.1 k
  adam.evals = {{30, 3.0}};
  const RunCurve r = load_run_curve(make_run(tmp, "adam", adam), CompareMetric::TrainLoss, 4);
  ASSERT_EQ(r.loss.size(), 27u);  // updates 4..30
  EXPECT_EQ(r.steps.front(), 4);
  EXPECT_NEAR(r.loss.front(), 10 - 0.1 * 2.5, 1e-12);  // mean of updates 1..4
  EXPECT_NEAR(r.loss.back(), 10 - 0.1 * 28.5, 1e-12);  // mean of 27..30
  const auto c = compare_runs({r}, "", CompareMetric::TrainLoss, false);
  EXPECT_NEAR(c.target, 7.15, 1e-12);
}

}  // namespace
}  // namespace multinorm
