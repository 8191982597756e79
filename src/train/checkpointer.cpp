// The trainer's checkpoints (checkpointer.h).
#include "checkpointer.h"

#include <cmath>

#include "multinorm/error.h"

namespace multinorm {

Checkpointer::Checkpointer(const RunConfig& run, ParamStore& params, Optimizer& optimizer, Comm& comm, std::string resumed_from)
    : run_(run), params_(params), optimizer_(optimizer), comm_(comm), last_good_(std::move(resumed_from)) {}

void Checkpointer::save(const TrainerState& state) {
  Comm::set_activity("the checkpoint of update " + std::to_string(state.step));
  // "The last good checkpoint" means finite weights: one reduction over the weights (on the device).
  const double weights_ss = params_.backend().optimizer_kernels().sum_squares(params_.params(), params_.arena_elements());
  if (!std::isfinite(weights_ss))
    throw Error("update " + std::to_string(state.step) + ": the weights are not finite; no checkpoint written. The last good checkpoint is " +
                (last_good_.empty() ? std::string("none") : last_good_));
  const std::vector<uint8_t> states = optimizer_.states_to_host();
  if (comm_.root()) last_good_ = write_checkpoint(run_.output_dir, params_, states, state, run_.checkpoint.keep_last, run_);
  else last_good_ = run_.output_dir + "/checkpoints/" + checkpoint_name(state.step);
  comm_.barrier();  // no rank runs ahead of a checkpoint that is not on disk yet
}

TrainerState Checkpointer::restore(const std::string& dir, bool allow_config_change) {
  return read_checkpoint(dir, params_, &optimizer_, run_, allow_config_change);
}

std::string previous_checkpoint(const std::string& run_dir, const std::string& newest) {
  std::string previous;
  const std::string newest_name = newest.substr(newest.find_last_of('/') + 1);
  for (const std::string& d : checkpoint_dirs(run_dir + "/checkpoints"))
    if (run_dir + "/checkpoints/" + d != newest && d < newest_name) previous = run_dir + "/checkpoints/" + d;
  return previous;
}

}  // namespace multinorm
