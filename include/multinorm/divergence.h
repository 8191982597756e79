// Divergence detection beyond non-finite losses: a run whose weights blew up but stayed finite can
// look alive (RMSNorm of huge activations, loss ln V, gradient norm 0). The monitor trips on
//   - a gradient norm of exactly zero (a trainable model never has one on real data);
//   - a loss spike: an update's loss over spike_factor x the median of the last spike_window losses
//     (once at least min(20, spike_window) are known);
//   - a loss stuck at or above its initial value ln V for stuck_evals evaluations in a row;
// and the trainer acts as divergence.action says: stop (the run ends with exit status 3 and
// result.json says it diverged), skip (the update is not applied; only for a spike, the others stop),
// or rollback (to the last good checkpoint, with the learning rate times rollback_lr_factor, at most
// max_rollbacks times; then stop). Every trip is a metrics.jsonl line and a log line.
#pragma once
#include <cstdint>
#include <deque>
#include <optional>
#include <string>

#include "multinorm/error.h"

namespace multinorm {

struct DivergenceConfig {
  std::string action = "stop";  // stop | skip | rollback
  bool zero_grad_norm = true;
  double spike_factor = 3.0;  // 0 = off
  int64_t spike_window = 100;
  int64_t stuck_evals = 3;  // 0 = off
  double rollback_lr_factor = 0.5;
  int64_t max_rollbacks = 3;
};

struct DivergenceTrip {
  std::string reason;  // "loss spike", "zero gradient norm", "loss stuck at ln V"
  double value = 0, threshold = 0;
  std::string describe() const;  // "loss spike: 9.87 > 6.42 (3 x the median of the last 100 losses)"
};

class DivergenceMonitor {
 public:
  DivergenceMonitor(const DivergenceConfig& c, double initial_loss);
  // An update's loss (before its step): a spike? The loss joins the history when it is not one.
  std::optional<DivergenceTrip> check_loss(double loss);
  // An applied update's gradient norm (before clipping).
  std::optional<DivergenceTrip> check_grad_norm(double grad_norm) const;
  // An evaluation's loss (or, without validation data, the training loss at the evaluation points).
  std::optional<DivergenceTrip> check_eval(double loss);
  // After a rollback: the history restarts.
  void reset();

 private:
  DivergenceConfig c_;
  double initial_;
  std::deque<double> recent_;
  int64_t stuck_ = 0;
};

// A run stopped by the divergence monitor: the CLI exits with status 3.
class DivergenceError : public Error {
 public:
  explicit DivergenceError(const std::string& message) : Error(message) {}
};

}  // namespace multinorm
