// The divergence monitor's judgement (include/multinorm/divergence.h) on sequences of updates whose
// statistics are formed as the device forms them (optim_math::finish_statistics, with the spike test
// the monitor handed out for that update); tests/faults.sh and test_trainer.cpp run them end to end.
#include <gtest/gtest.h>

#include <cmath>

#include "../kernels/common/optim_math.h"
#include "multinorm/divergence.h"
#include "multinorm/optimizer.h"

using namespace multinorm;

namespace {

// An update's statistics as the device computes them from one micro-batch's loss and a gradient
// norm, under the spike test the monitor gave for it.
StepStats on_the_device(double loss, double grad_norm, const SpikeTest& test) {
  const LossTotals totals{loss, 1, loss, 1};
  UpdateScalars rules;
  rules.spike_threshold = test.threshold;
  rules.skip_spikes = test.skip;
  const double squares = grad_norm * grad_norm;
  const UpdateStatistics s = optim_math::finish_statistics(&squares, 1, totals, rules, 0.0);
  StepStats st;
  st.loss = s.loss, st.grad_norm = s.grad_norm, st.skipped = s.skip, st.spike = s.spike;
  st.skip_reason = static_cast<SkipReason>(s.skip_reason);
  return st;
}

// The next update through the monitor: its spike test, the device's statistics, the verdict.
Verdict next(DivergenceMonitor& m, double loss, double grad_norm = 1.0, int64_t skipped_in_a_row = 0) {
  return m.judge(on_the_device(loss, grad_norm, m.spike_test()), skipped_in_a_row);
}

}  // namespace

TEST(Divergence, ALossSpikeOverTheFactorTimesTheRunningMedianTrips) {
  DivergenceConfig c;
  c.spike_factor = 3.0, c.spike_window = 50;
  DivergenceMonitor warmup(c, std::log(32000.0));
  // The first 20 losses only build the history: a jump among them is no spike yet.
  for (int i = 0; i < 19; ++i) EXPECT_EQ(next(warmup, i == 18 ? 100.0 : 1.0).kind, Verdict::Applied) << i;
  DivergenceMonitor m(c, std::log(32000.0));
  EXPECT_TRUE(std::isinf(m.spike_test().threshold)) << "no history: no threshold";
  for (int i = 0; i < 60; ++i) EXPECT_EQ(next(m, 3.5 + 0.1 * (i % 3)).kind, Verdict::Applied) << i;  // the last 50: median 3.6
  EXPECT_NEAR(m.spike_test().threshold, 3 * 3.6, 1e-9);
  EXPECT_EQ(next(m, 10.7).kind, Verdict::Applied);  // under 3 x 3.6 = 10.8: a bump, not a spike (it joins the history)
  const Verdict v = next(m, 11.0);
  ASSERT_EQ(v.kind, Verdict::Diverged) << "divergence.action stop: a spike stops the run";
  EXPECT_NE(v.why.reason.find("loss spike"), std::string::npos) << v.why.reason;
  EXPECT_EQ(v.why.value, 11.0);
  EXPECT_NEAR(v.why.threshold, 3 * 3.6, 1e-9);
  EXPECT_EQ(next(m, 3.6).kind, Verdict::Applied);  // the spike did not enter the history
  EXPECT_NEAR(m.spike_test().threshold, 3 * 3.6, 1e-9);
  c.spike_factor = 0;  // off
  DivergenceMonitor off(c, 10);
  for (int i = 0; i < 40; ++i) EXPECT_EQ(next(off, i < 30 ? 1.0 : 100.0).kind, Verdict::Applied);
}

// divergence.action skip: the device skips a spiking update (the monitor's test says so), and one
// whose loss or norm is not finite; the monitor counts them and stops after max_consecutive_skips in
// a row. Under stop, a non-finite update stops the run at once (the device applied nothing).
TEST(Divergence, SkippedUpdatesAreCountedAndStopAfterTooManyInARow) {
  DivergenceConfig c;
  c.action = DivergenceAction::Skip, c.spike_window = 20, c.max_consecutive_skips = 3;
  DivergenceMonitor m(c, 10);
  for (int i = 0; i < 20; ++i) next(m, 2.0);
  EXPECT_TRUE(m.spike_test().skip);
  const StepStats spike = on_the_device(7.0, 1.0, m.spike_test());
  EXPECT_TRUE(spike.skipped && spike.skip_reason == kLossSpike) << "the device skips the spike";
  const Verdict v = m.judge(spike, 0);
  EXPECT_EQ(v.kind, Verdict::Skipped);
  EXPECT_NE(v.why.reason.find("loss spike"), std::string::npos) << v.why.reason;
  EXPECT_EQ(next(m, std::nan(""), 1.0, 1).kind, Verdict::Skipped);
  const Verdict third = next(m, 2.0, std::nan(""), 2);
  ASSERT_EQ(third.kind, Verdict::Diverged);
  EXPECT_NE(third.why.reason.find("3 consecutive skipped updates"), std::string::npos) << third.why.reason;
  EXPECT_NE(third.why.reason.find("non-finite gradient norm"), std::string::npos) << third.why.reason;
  EXPECT_EQ(next(m, 2.0).kind, Verdict::Applied);
  DivergenceMonitor stop(DivergenceConfig{}, 10);
  const Verdict nan_loss = next(stop, std::nan(""), std::nan(""));
  ASSERT_EQ(nan_loss.kind, Verdict::Diverged);
  EXPECT_EQ(nan_loss.why.reason, "non-finite loss") << "the loss is named first";
}

TEST(Divergence, AZeroGradientNormTrips) {
  DivergenceMonitor m(DivergenceConfig{}, 10);
  EXPECT_EQ(next(m, 1.0, 0.0).kind, Verdict::Diverged);
  EXPECT_EQ(next(m, 1.0, 1e-30).kind, Verdict::Applied);
  DivergenceConfig c;
  c.zero_grad_norm = false;
  DivergenceMonitor off(c, 10);
  EXPECT_EQ(next(off, 1.0, 0.0).kind, Verdict::Applied);
}

TEST(Divergence, ALossStuckAtLnVForNEvaluationsTrips) {
  DivergenceConfig c;
  c.stuck_evals = 3;
  const double lnv = std::log(8192.0);
  DivergenceMonitor m(c, lnv);
  EXPECT_EQ(m.judge_evaluation(lnv).kind, Verdict::Applied);
  EXPECT_EQ(m.judge_evaluation(lnv + 0.1).kind, Verdict::Applied);
  EXPECT_EQ(m.judge_evaluation(lnv - 1).kind, Verdict::Applied);  // below: the count restarts
  EXPECT_EQ(m.judge_evaluation(lnv).kind, Verdict::Applied);
  EXPECT_EQ(m.judge_evaluation(lnv).kind, Verdict::Applied);
  const Verdict v = m.judge_evaluation(lnv);
  ASSERT_EQ(v.kind, Verdict::Diverged);
  EXPECT_NE(v.why.reason.find("stuck"), std::string::npos);
  m.reset();
  EXPECT_EQ(m.judge_evaluation(lnv).kind, Verdict::Applied);
}
