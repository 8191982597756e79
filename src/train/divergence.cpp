// The divergence monitor (include/multinorm/divergence.h).
#include "multinorm/divergence.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "multinorm/optimizer.h"

namespace multinorm {

std::string DivergenceTrip::describe() const {
  char buf[256];
  if (std::isfinite(value) && threshold != 0) std::snprintf(buf, sizeof buf, "%s: %.6g against a threshold of %.6g", reason.c_str(), value, threshold);
  else std::snprintf(buf, sizeof buf, "%s (%.6g)", reason.c_str(), value);
  return buf;
}

DivergenceMonitor::DivergenceMonitor(const DivergenceConfig& c, double initial_loss) : c_(c), initial_(initial_loss) {}

SpikeTest DivergenceMonitor::spike_test() {
  last_test_ = SpikeTest{};
  last_test_.skip = c_.action == DivergenceAction::Skip;
  const size_t known = recent_.size(), needed = static_cast<size_t>(std::min<int64_t>(20, c_.spike_window));
  if (c_.spike_factor > 0 && known >= needed && known > 0) {
    std::vector<double> sorted(recent_.begin(), recent_.end());
    std::nth_element(sorted.begin(), sorted.begin() + static_cast<long>(sorted.size() / 2), sorted.end());
    last_test_.threshold = c_.spike_factor * sorted[sorted.size() / 2];
    last_test_reason_ = "loss spike (over " + std::to_string(c_.spike_factor).substr(0, 4) + " x the median of the last " +
                        std::to_string(known) + " losses)";
  }
  return last_test_;
}

Verdict DivergenceMonitor::judge(const StepStats& st, int64_t skipped_in_a_row) {
  const bool skips = c_.action == DivergenceAction::Skip;
  if (st.skipped) {  // the device applied nothing
    Verdict v{skips ? Verdict::Skipped : Verdict::Diverged, {}};
    if (st.skip_reason == kLossSpike) v.why = {last_test_reason_, st.loss, last_test_.threshold};
    else if (st.skip_reason == kNonFiniteLoss) v.why = {"non-finite loss", st.loss, 0.0};
    else v.why = {"non-finite gradient norm", st.grad_norm, 0.0};
    // Weights that went non-finite make every later update non-finite: stop instead of skipping to
    // the end and reporting a complete run.
    if (skips && skipped_in_a_row + 1 >= c_.max_consecutive_skips)
      v = {Verdict::Diverged,
           {std::to_string(skipped_in_a_row + 1) + " consecutive skipped updates (divergence.max_consecutive_skips), the last for " + v.why.reason,
            static_cast<double>(skipped_in_a_row + 1), static_cast<double>(c_.max_consecutive_skips)}};
    return v;
  }
  if (st.spike) return {Verdict::Diverged, {last_test_reason_, st.loss, last_test_.threshold}};  // not skipped: stop or rollback
  recent_.push_back(st.loss);
  if (static_cast<int64_t>(recent_.size()) > c_.spike_window) recent_.pop_front();
  if (c_.zero_grad_norm && st.grad_norm == 0.0) return {Verdict::Diverged, {"zero gradient norm", st.grad_norm, 0.0}};
  return {};
}

Verdict DivergenceMonitor::judge_evaluation(double loss) {
  if (c_.stuck_evals <= 0) return {};
  stuck_ = loss >= initial_ ? stuck_ + 1 : 0;
  if (stuck_ >= c_.stuck_evals)
    return {Verdict::Diverged,
            {"loss stuck at or above its initial value ln V for " + std::to_string(stuck_) + " evaluations", loss, initial_}};
  return {};
}

void DivergenceMonitor::reset() {
  recent_.clear();
  stuck_ = 0;
}

}  // namespace multinorm
