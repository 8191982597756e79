// One training run: its parts (run_parts.h), assembled at construction, and the three things the
// update loop (trainer.cpp) asks of them: queue an update's micro-batches, queue its optimizer step,
// settle an update queued earlier; and the state the loop carries between updates (the trainer
// state, the divergence monitor, the loader, the stop signals, the clocks).
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "multinorm/divergence.h"
#include "multinorm/loader.h"
#include "multinorm/stop_signals.h"
#include "multinorm/trainer.h"
#include "multinorm/update_pipeline.h"
#include "run_parts.h"

namespace multinorm {

using Clock = std::chrono::steady_clock;

// One update between its queuing and its settling: what the host knows of it before its statistics.
struct QueuedUpdate {
  int64_t k = 0;
  LoaderCursor cursor;  // the data position once its batches are consumed
  UpdateTimes times;
};

class TrainingRun {
 public:
  TrainingRun(const RunConfig& run, const TrainOptions& opt);
  ~TrainingRun();
  int64_t next_update() const { return state_.step + 1; }
  int64_t last_update() const { return last_; }

  // Update k's data and micro-batches, queued with no host wait, and its gradient reduction; nothing
  // (nullopt) once a stop signal came to any rank (the ranks agree in the update's first collective).
  std::optional<QueuedUpdate> queue_micro_batches(int64_t k);
  // Its gradient reduction finished, then its optimizer step queued behind its micro-batches, with
  // the judge's spike test (UpdatePipeline::queue_step).
  void queue_step(QueuedUpdate& u);
  // The update's statistics read (a wait for its step, while the next update's micro-batches keep
  // the device busy), judged, logged; then evaluation and checkpoint when due. True when a
  // divergence trip rolled the run back (the loop goes on from next_update()).
  bool settle(const QueuedUpdate& u);
  // An update queued when a rollback came: its reduction completed, its gradients dropped.
  void discard(QueuedUpdate& u);
  // The end of the run: a checkpoint of the last update when a signal stopped it, result.json when
  // complete, the CUDA graph counts in the log.
  TrainResult finish();

 private:
  void restore(const std::string& dir, bool allow_config_change, const std::function<void(TrainerState&)>& adjust = {});
  void sum_up();
  void write_result(const json& divergence);
  void describe() const;
  void record(const QueuedUpdate& u, const StepStats& st);
  void note_skip(int64_t k, const Verdict& v);
  void warn_swan(int64_t k, const StepStats& st);
  bool evaluate_and_checkpoint(int64_t k, double loss);
  bool on_trip(const DivergenceTrip& trip, int64_t k);
  RunLog& log() const { return *parts_.log; }

  const RunConfig& run_;
  TrainOptions opt_;
  Comm& comm_;
  int world_, rank_;
  int64_t first_ = 0, last_ = 0;
  Clock::time_point t_start_;
  RunParts parts_;
  DivergenceMonitor monitor_;
  std::unique_ptr<TrainLoader> loader_;
  TrainerState state_;
  TrainResult result_;
  StopSignals stop_signals_;  // while the run lives: SIGTERM, SIGINT, SIGUSR1 stop it after an update
  int stopped_by_ = 0;        // the signal every rank stops for (0: none)
  Clock::time_point t_loop_, t_last_end_;
  // An update's step_s is the time from the last record to its own, moved by the host time of
  // queuing micro-batches: the loop queues update k + 1's before it settles k, so that time falls in
  // k's interval and is owed to k + 1 (on the CPU it is k + 1's forward and backward).
  int64_t queued_k_ = -1;     // the update whose micro-batches were queued last
  double queued_s_ = 0.0;     // ... and the host time that took
  double owed_s_ = 0.0;       // queuing time the next record adds (moved out of the last one)
  QueueCounters counted_;  // the queue's counters at the last record
  int64_t tokens_this_run_ = 0, swan_warnings_ = 0;
};

}  // namespace multinorm
