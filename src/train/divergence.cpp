// The divergence monitor (include/multinorm/divergence.h).
#include "multinorm/divergence.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

namespace multinorm {

std::string DivergenceTrip::describe() const {
  char buf[256];
  if (std::isfinite(value) && threshold != 0) std::snprintf(buf, sizeof buf, "%s: %.6g against a threshold of %.6g", reason.c_str(), value, threshold);
  else std::snprintf(buf, sizeof buf, "%s (%.6g)", reason.c_str(), value);
  return buf;
}

DivergenceMonitor::DivergenceMonitor(const DivergenceConfig& c, double initial_loss) : c_(c), initial_(initial_loss) {}

std::optional<DivergenceTrip> DivergenceMonitor::check_loss(double loss) {
  const size_t known = recent_.size(), needed = static_cast<size_t>(std::min<int64_t>(20, c_.spike_window));
  if (c_.spike_factor > 0 && known >= needed && known > 0) {
    std::vector<double> sorted(recent_.begin(), recent_.end());
    std::nth_element(sorted.begin(), sorted.begin() + static_cast<long>(sorted.size() / 2), sorted.end());
    const double median = sorted[sorted.size() / 2], threshold = c_.spike_factor * median;
    if (loss > threshold) return DivergenceTrip{"loss spike (over " + std::to_string(c_.spike_factor).substr(0, 4) + " x the median of the last " +
                                                    std::to_string(known) + " losses)",
                                                loss, threshold};
  }
  recent_.push_back(loss);
  if (static_cast<int64_t>(recent_.size()) > c_.spike_window) recent_.pop_front();
  return std::nullopt;
}

std::optional<DivergenceTrip> DivergenceMonitor::check_grad_norm(double grad_norm) const {
  if (c_.zero_grad_norm && grad_norm == 0.0) return DivergenceTrip{"zero gradient norm", grad_norm, 0.0};
  return std::nullopt;
}

std::optional<DivergenceTrip> DivergenceMonitor::check_eval(double loss) {
  if (c_.stuck_evals <= 0) return std::nullopt;
  stuck_ = loss >= initial_ ? stuck_ + 1 : 0;
  if (stuck_ >= c_.stuck_evals)
    return DivergenceTrip{"loss stuck at or above its initial value ln V for " + std::to_string(stuck_) + " evaluations", loss, initial_};
  return std::nullopt;
}

void DivergenceMonitor::reset() {
  recent_.clear();
  stuck_ = 0;
}

}  // namespace multinorm
