// Checkpoints: <run>/checkpoints/step_NNNNNNNN/ with
//   model.safetensors   weights in the run's parameter dtype (exact bits), Hugging Face names
//   config.json         Hugging Face LlamaConfig (so the directory loads in transformers)
//   optimizer.bin       the optimizer's state arena, raw
//   trainer_state.json  step, tokens seen, data cursor, skipped updates, config fingerprint
// written into step_NNNNNNNN.tmp, every file fsynced, then renamed: a process killed at any moment
// leaves the previous checkpoint intact and no half-written one that looks complete.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "multinorm/checksum.h"

#include "multinorm/param_store.h"
#include "multinorm/loader.h"
#include "multinorm/optimizer.h"
#include "multinorm/run_config.h"

namespace multinorm {

struct TrainerState {
  int64_t step = 0, tokens_seen = 0, skipped = 0;
  int64_t skipped_in_a_row = 0;  // consecutive skipped updates ending at `step`
  LoaderCursor cursor;
  std::string fingerprint;
  uint64_t tokenizer_hash = 0;  // the data's tokenizer (check_data_identity); 0: unknown
  double lr_scale = 1.0;        // the divergence monitor's rollbacks so far lowered the learning rate by this
  int64_t rollbacks = 0;
};

// The parts of a run config a checkpoint must agree with to be resumed (model, batch, optimizer,
// schedule, precision, data layout, seed), as a stable string. Left out: what does not change the
// run's math, such as batch.micro_batch under token_mean loss normalisation (the same sequences make
// each update, only grouped differently); under micro_batch_mean it weighs tokens differently, so
// it stays in. Likewise the settings of optimizers the run does not use (a SinkGD run's optimizer.swan).
std::string config_fingerprint(const RunConfig& run);

// "optimizer.lr: 0.02 -> 0.01" lines for every leaf that differs between two fingerprints. A key one
// holds alone counts ("v -> (unset)", "(unset) -> v") where the other holds the object it sits in;
// a whole object one leaves out (an unused optimizer's settings, an object a later version added)
// does not, nor does batch.micro_batch (left out under token_mean).
std::vector<std::string> fingerprint_diff(const std::string& stored, const std::string& current);

// The run config a checkpoint was written with: its own run_config.json, or (checkpoints of earlier
// versions) the run directory's config.json two levels up. Error naming both when neither exists.
std::string checkpoint_run_config_path(const std::string& checkpoint_dir);

// Removes checkpoint temporaries (step_NNNNNNNN.tmp.<pid>) under <run_dir>/checkpoints: the trainer
// calls it holding the run directory's lock, so any it finds belong to a trainer that died.
void remove_stale_checkpoint_temporaries(const std::string& run_dir);

// The manifest of checkpoint `dir`: each file's path, size and CRC-32C. CorruptFileError naming the
// checkpoint when there is none (a crash while writing it) or it is damaged.
std::map<std::string, ExpectedFile> read_manifest(const std::string& dir);
// Every file of checkpoint `dir` read and checked against its manifest (`multinorm checkpoint verify`);
// CorruptFileError naming the first damaged file.
struct CheckedFile {
  std::string path;
  uint64_t bytes = 0;
  uint32_t crc = 0;
  ExpectedFile expected;
};
std::vector<CheckedFile> verify_checkpoint(const std::string& dir);
// While the returned scope lives, reads of `dir`'s files are checked against its manifest; nullptr
// when `dir` has none (a Hugging Face directory from elsewhere, e.g. model.init_from).
std::unique_ptr<ExpectedChecksums> verify_reads_of(const std::string& dir);

// Names of the complete checkpoint directories under `root` (step_NNNNNNNN, no suffix), oldest first.
std::vector<std::string> checkpoint_dirs(const std::string& root);

// "step_00000300": the directory name of update `step`'s checkpoint under run_dir/checkpoints.
std::string checkpoint_name(int64_t step);
// A self-sufficient directory: model.safetensors + config.json (Hugging Face: the weights of
// `params`, a model of run.model), optimizer.bin, trainer_state.json and run_config.json (the
// resolved run config), published atomically. optimizer_states: Optimizer::states_to_host()
// (gathered on rank 0 from a sharded optimizer).
std::string write_checkpoint(const std::string& run_dir, const ParamStore& params, const std::vector<uint8_t>& optimizer_states,
                             const TrainerState& state, int64_t keep_last, const RunConfig& run);
// The weights into `params` (a model of run.model). With `opt` (resume): its state too, and refuses
// a checkpoint whose fingerprint differs from `run`'s, listing the differences, unless
// `allow_config_change`, which prints them and goes on.
TrainerState read_checkpoint(const std::string& dir, ParamStore& params, Optimizer* opt, const RunConfig& run,
                             bool allow_config_change = false);

}  // namespace multinorm
