// The run log: what a training run tells its user and its files. metrics.jsonl (one JSON line per
// update, evaluation and divergence trip, flushed and checked at once: a full disk is an error naming
// the update), the progress line on a terminal (rewritten in place), and text lines on stderr
// otherwise; TensorBoard event files of the same scalars (event_file.h) unless log.tensorboard is
// off. Rank 0 writes; on the other ranks every call does nothing.
#pragma once
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include "multinorm/schema.h"
#include "multinorm/optimizer.h"
#include "multinorm/trainer.h"
#include "multinorm/update_pipeline.h"
#include "event_file.h"

namespace multinorm {

// One settled update as the log shows it.
struct UpdateRecord {
  const StepStats* stats = nullptr;
  int64_t tokens_seen = 0;     // every rank's tokens so far, padding included
  int64_t raw_tokens = 0;      // this update's, padding included
  double step_s = 0;           // since the previous update's record
  UpdateTimes times;
  QueueCounters waits;         // host waits and drains since the previous record
  double eta_s = 0;
};

class RunLog {
 public:
  // `last_update`: the run's last update (progress); `log_every`: a text line every N updates;
  // `tensorboard`: event files too.
  RunLog(const std::string& run_dir, bool root, bool quiet, int64_t log_every, int64_t last_update, bool tensorboard);
  ~RunLog();

  // A line of text on stderr (rank 0, not quiet), after the progress line when one is up.
  template <class... Args>
  void say(const char* fmt, Args... args) {
    if (!talk_) return;
    if (progress_up_) std::fputc('\n', stderr), progress_up_ = false;
    std::fprintf(stderr, fmt, args...);
  }
  void update(int64_t step, const UpdateRecord& r);
  void evaluation(int64_t step, const EvalResult& e, double seconds);
  void divergence(const json& line);
  // result.json: how the run ended (rank 0 writes it whole, atomically; sweeps and compare read it).
  void result(const json& r);
  // Drops the metrics lines after update `step`, keeping every divergence line (a resume rewrites
  // what came after its checkpoint; a rollback drops the updates it undid, not the record of why).
  void rewind_to(int64_t step);
  // Ends the progress line.
  void end();

 private:
  void write(const json& line, const std::string& what);
  std::string run_dir_, path_;
  bool root_, talk_, tty_;
  int64_t log_every_, last_;
  bool progress_up_ = false;
  std::ofstream metrics_;
  std::unique_ptr<EventFile> events_;
};

}  // namespace multinorm
