// Checkpoints: <run>/checkpoints/step_NNNNNNNN/ with
//   model.safetensors   weights in the run's parameter dtype (exact bits), Hugging Face names
//   config.json         Hugging Face LlamaConfig (so the directory loads in transformers)
//   optimizer.bin       the optimizer's state arena, raw
//   trainer_state.json  step, tokens seen, data cursor, skipped updates, config fingerprint
// written into step_NNNNNNNN.tmp, every file fsynced, then renamed: a process killed at any moment
// leaves the previous checkpoint intact and no half-written one that looks complete.
#pragma once
#include <string>
#include <vector>

#include "multinorm/llama_model.h"
#include "multinorm/loader.h"
#include "multinorm/optimizer.h"
#include "multinorm/run_config.h"

namespace multinorm {

struct TrainerState {
  int64_t step = 0, tokens_seen = 0, skipped = 0;
  int64_t skipped_in_a_row = 0;  // consecutive skipped updates ending at `step`
  LoaderCursor cursor;
  std::string fingerprint;
};

// The parts of a run config a checkpoint must agree with to be resumed (model, batch, optimizer,
// precision, data layout, seed), as a stable string.
std::string config_fingerprint(const RunConfig& run);

// Names of the complete checkpoint directories under `root` (step_NNNNNNNN, no suffix), oldest first.
std::vector<std::string> checkpoint_dirs(const std::string& root);

// "step_00000300": the directory name of update `step`'s checkpoint under run_dir/checkpoints.
std::string checkpoint_name(int64_t step);
std::string write_checkpoint(const std::string& run_dir, const LlamaModel& model, const Optimizer& opt,
                             const TrainerState& state, int64_t keep_last);
TrainerState read_checkpoint(const std::string& dir, LlamaModel& model, Optimizer* opt, const RunConfig& run);

}  // namespace multinorm
