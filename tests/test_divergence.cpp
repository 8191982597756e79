// The divergence monitor's trips (include/multinorm/divergence.h) on loss and gradient-norm sequences;
// tests/faults.sh runs them end to end (lr 1e6, rollbacks).
#include <gtest/gtest.h>

#include <cmath>

#include "multinorm/divergence.h"

using namespace multinorm;

TEST(Divergence, ALossSpikeOverTheFactorTimesTheRunningMedianTrips) {
  DivergenceConfig c;
  c.spike_factor = 3.0, c.spike_window = 50;
  DivergenceMonitor warmup(c, std::log(32000.0));
  // The first 20 losses only build the history: a jump among them is no spike yet.
  for (int i = 0; i < 19; ++i) EXPECT_FALSE(warmup.check_loss(i == 18 ? 100.0 : 1.0)) << i;
  DivergenceMonitor m(c, std::log(32000.0));
  for (int i = 0; i < 60; ++i) EXPECT_FALSE(m.check_loss(3.5 + 0.1 * (i % 3))) << i;  // the last 50: median 3.6
  EXPECT_FALSE(m.check_loss(10.7));  // under 3 x 3.6 = 10.8: a bump, not a spike (it joins the history)
  const auto trip = m.check_loss(11.0);
  ASSERT_TRUE(trip);
  EXPECT_NE(trip->reason.find("loss spike"), std::string::npos) << trip->reason;
  EXPECT_EQ(trip->value, 11.0);
  EXPECT_NEAR(trip->threshold, 3 * 3.6, 1e-9);
  EXPECT_FALSE(m.check_loss(3.6));  // the spike did not enter the history
  c.spike_factor = 0;  // off
  DivergenceMonitor off(c, 10);
  for (int i = 0; i < 40; ++i) EXPECT_FALSE(off.check_loss(i < 30 ? 1.0 : 100.0));
}

TEST(Divergence, AZeroGradientNormTrips) {
  DivergenceMonitor m(DivergenceConfig{}, 10);
  EXPECT_TRUE(m.check_grad_norm(0.0));
  EXPECT_FALSE(m.check_grad_norm(1e-30));
  DivergenceConfig c;
  c.zero_grad_norm = false;
  EXPECT_FALSE(DivergenceMonitor(c, 10).check_grad_norm(0.0));
}

TEST(Divergence, ALossStuckAtLnVForNEvaluationsTrips) {
  DivergenceConfig c;
  c.stuck_evals = 3;
  const double lnv = std::log(8192.0);
  DivergenceMonitor m(c, lnv);
  EXPECT_FALSE(m.check_eval(lnv));
  EXPECT_FALSE(m.check_eval(lnv + 0.1));
  EXPECT_FALSE(m.check_eval(lnv - 1));  // below: the count restarts
  EXPECT_FALSE(m.check_eval(lnv));
  EXPECT_FALSE(m.check_eval(lnv));
  const auto trip = m.check_eval(lnv);
  ASSERT_TRUE(trip);
  EXPECT_NE(trip->reason.find("stuck"), std::string::npos);
  m.reset();
  EXPECT_FALSE(m.check_eval(lnv));
}
