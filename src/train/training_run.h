// One training run's parts, set up and torn down together, and the three things the update loop
// (trainer.cpp) asks of them: queue an update's micro-batches, queue its optimizer step, settle an
// update queued earlier. Set-up validates the config and the data before it creates or locks the run
// directory, then builds the backend, the model, data parallelism, the optimizer, the data loader
// and, resuming, reads the checkpoint.
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "checkpointer.h"
#include "multinorm/data_parallel.h"
#include "multinorm/device.h"
#include "multinorm/divergence.h"
#include "multinorm/llama_model.h"
#include "multinorm/loader.h"
#include "multinorm/optimizer.h"
#include "multinorm/run_lock.h"
#include "multinorm/stop_signals.h"
#include "multinorm/trainer.h"
#include "multinorm/update_pipeline.h"
#include "run_log.h"

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
  // Its gradient reduction finished, then its optimizer step queued behind its micro-batches
  // (Optimizer::queue_step, with the judge's spike test).
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
  void check_config() const;
  std::vector<std::string> shard_files(const char* key, const std::string& globs) const;
  void open_data();
  void take_run_directory();
  void build_model_and_optimizer();
  void resume();
  void restore(const std::string& from);
  json result_common(bool diverged) const;
  void describe() const;
  void record(const QueuedUpdate& u, const StepStats& st);
  void note_skip(int64_t k, const Verdict& v);
  void warn_swan(int64_t k, const StepStats& st);
  bool evaluate_and_checkpoint(int64_t k, double loss);
  bool on_trip(const DivergenceTrip& trip, int64_t k);

  const RunConfig& run_;
  TrainOptions opt_;
  Comm& comm_;
  BackendChoice choice_;
  int world_, rank_;
  int64_t accum_ = 0, first_ = 0, last_ = 0;
  std::shared_ptr<const ShardSet> train_data_, val_data_;
  uint64_t tokenizer_hash_ = 0;
  std::string data_note_;
  std::unique_ptr<RunDirLock> lock_;
  std::string existing_;  // the checkpoint this run resumes from ("" when fresh)
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<Communicator> grad_comm_;
  ShardPlan plan_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<GradientSync> grad_sync_;
  std::unique_ptr<UpdatePipeline> pipeline_;
  std::unique_ptr<Checkpointer> checkpointer_;
  DivergenceMonitor monitor_;
  std::unique_ptr<RunLog> log_;
  std::unique_ptr<TrainLoader> loader_;
  TrainerState state_;
  TrainResult result_;
  StopSignals stop_signals_;  // while the run lives: SIGTERM, SIGINT, SIGUSR1 stop it after an update
  int stopped_by_ = 0;        // the signal every rank stops for (0: none)
  Clock::time_point t_start_, t_loop_, t_last_end_;
  QueueCounters counted_;  // the queue's counters at the last record
  int64_t tokens_this_run_ = 0, swan_warnings_ = 0;
};

}  // namespace multinorm
