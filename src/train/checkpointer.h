// When and how a training run writes its checkpoints, and which one is its last good one: the
// trainer's part of checkpointing (the file format is checkpoint.h). A checkpoint is written only
// from finite weights (checked on the device first); the ranks hold identical models, a sharded
// optimizer state is gathered on rank 0, which writes; no rank runs ahead of a checkpoint that is
// not on disk yet.
#pragma once
#include <cstdint>
#include <string>

#include "multinorm/backend.h"
#include "multinorm/checkpoint.h"
#include "multinorm/comm.h"
#include "multinorm/param_store.h"
#include "multinorm/optimizer.h"
#include "multinorm/run_config.h"

namespace multinorm {

class Checkpointer {
 public:
  // `resumed_from`: the checkpoint the run started from ("" for a fresh run): the last good one until
  // this run writes one.
  Checkpointer(const RunConfig& run, ParamStore& params, Optimizer& optimizer, Comm& comm, std::string resumed_from);

  bool due(int64_t update, bool last) const { return (run_.checkpoint.every > 0 && update % run_.checkpoint.every == 0) || last; }
  void save(const TrainerState& state);
  // The newest checkpoint this run wrote, or the one it resumed from ("" when none).
  const std::string& last_good() const { return last_good_; }
  // The weights, optimizer state and trainer state of checkpoint `dir`, read back (resume, rollback).
  TrainerState restore(const std::string& dir, bool allow_config_change);

 private:
  const RunConfig& run_;
  ParamStore& params_;
  Optimizer& optimizer_;
  Comm& comm_;
  std::string last_good_;
};

// The newest checkpoint under run_dir/checkpoints older than `newest` (the one to resume from when
// `newest` is damaged), or "".
std::string previous_checkpoint(const std::string& run_dir, const std::string& newest);

}  // namespace multinorm
