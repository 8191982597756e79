// Divergence and skipped updates, decided in one place (DivergenceMonitor::judge). Beyond non-finite
// losses: a run whose weights blew up but stayed finite can look alive (RMSNorm of huge activations,
// loss ln V, gradient norm 0). The monitor trips on
//   - a non-finite loss or gradient norm;
//   - a gradient norm of exactly zero (a trainable model never has one on real data);
//   - a loss spike: an update's loss over spike_factor x the median of the last spike_window losses
//     (once at least min(20, spike_window) are known);
//   - a loss stuck at or above its initial value ln V for stuck_evals evaluations in a row;
// and the trainer acts as divergence.action says: stop (the run ends with exit status 3 and
// result.json says it diverged), skip (a non-finite or spiking update is not applied, at most
// max_consecutive_skips in a row; the other trips stop), or rollback (to the last good checkpoint,
// with the learning rate times rollback_lr_factor, at most max_rollbacks times; then stop). Every
// trip is a metrics.jsonl line and a log line.
//
// The device decides what it applies: it skips an update whose loss or norm is not finite, or whose
// loss exceeds the spike threshold the monitor gave it when the update was queued (spike_test(),
// from the losses judged before it) and the action is skip. judge() then reads the statistics the
// device computed and says what the trainer does.
#pragma once
#include <cstdint>
#include <deque>
#include <limits>
#include <optional>
#include <string>

#include "multinorm/error.h"
#include "multinorm/optimizer.h"   // StepStats, SpikeTest: what the device computed and tests
#include "multinorm/run_config.h"  // DivergenceConfig

namespace multinorm {

struct DivergenceTrip {
  std::string reason;  // "loss spike", "zero gradient norm", "loss stuck at ln V"
  double value = 0, threshold = 0;
  std::string describe() const;  // "loss spike: 9.87 > 6.42 (3 x the median of the last 100 losses)"
};

// What the trainer does with a settled update.
struct Verdict {
  enum Kind { Applied, Skipped, Diverged } kind = Applied;
  DivergenceTrip why;  // Skipped: what made the device skip it; Diverged: the trip
};

class DivergenceMonitor {
 public:
  DivergenceMonitor(const DivergenceConfig& c, double initial_loss);
  // The spike test for the next update queued, from the losses judged so far.
  SpikeTest spike_test();
  // The only place an update is judged: its statistics (as the device computed them, having skipped
  // the update where they say so), the skips before it in a row, the run's rules. An applied loss
  // that is not a spike joins the history.
  Verdict judge(const StepStats& st, int64_t skipped_in_a_row);
  // An evaluation's loss (or, without validation data, the training loss at the evaluation points).
  Verdict judge_evaluation(double loss);
  // After a rollback: the history restarts.
  void reset();

 private:
  DivergenceConfig c_;
  double initial_;
  std::deque<double> recent_;
  int64_t stuck_ = 0;
  SpikeTest last_test_;          // the test of the update queued last
  std::string last_test_reason_;
};

// A run stopped by the divergence monitor: the CLI exits with status 3.
class DivergenceError : public Error {
 public:
  explicit DivergenceError(const std::string& message) : Error(message) {}
};

}  // namespace multinorm
