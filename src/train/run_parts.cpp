// A training run's parts, in the order they are built (run_parts.h).
#include "run_parts.h"

#include <unistd.h>

#include <algorithm>

#include "multinorm/c4_reader.h"
#include "multinorm/checkpoint.h"
#include "multinorm/error.h"
#include "multinorm/json_file.h"
#include "multinorm/model_io.h"
#include "multinorm/param_groups.h"
#include "multinorm/shard_plan.h"

namespace multinorm {

namespace {

// The cross-key rules that need the rank count.
void check_config(const RunConfig& run, int world) {
  if (run.data.train.empty()) throw ConfigError(run.source + ": data.train: no training shards configured");
  check_batch_over_ranks(run, world);
  if (run.eval.micro_batch > run.batch.micro_batch)
    throw ConfigError(run.source + ": eval.micro_batch " + std::to_string(run.eval.micro_batch) + " exceeds batch.micro_batch " +
                      std::to_string(run.batch.micro_batch));
}

// The files of data.train or data.validation: none is an error naming the config, the key and what
// makes shards. Relative paths resolve against the working directory (docs/configs.md).
std::vector<std::string> shard_files(const RunConfig& run, const char* key, const std::string& globs) {
  try {
    return expand_globs(globs);
  } catch (const Error& e) {
    char cwd[4096] = "?";
    if (!::getcwd(cwd, sizeof(cwd))) cwd[0] = '?', cwd[1] = 0;
    throw ConfigError(run.source + ": " + key + ": " + e.what() + " (relative to the working directory " + cwd +
                      "): make the shards with `multinorm data tokenize` (docs/training-on-c4.md), or set " + key);
  }
}

// The shards, made with the run's tokenizer, in its layout, for its vocabulary (errors name the shard).
RunData open_data(const RunConfig& run) {
  if (!run.data.tokenizer.empty() && ::access(run.data.tokenizer.c_str(), R_OK) != 0)
    throw ConfigError(run.source + ": data.tokenizer: " + run.data.tokenizer +
                      " does not exist (or cannot be read): the SentencePiece model the shards were made with (docs/training-on-c4.md)");
  RunData d;
  d.train = std::make_shared<const ShardSet>(shard_files(run, "data.train", run.data.train), run.batch.seq_len, run.model.vocab_size);
  if (!run.data.validation.empty())
    d.validation = std::make_shared<const ShardSet>(shard_files(run, "data.validation", run.data.validation), run.batch.seq_len,
                                                    run.model.vocab_size);
  d.tokenizer_hash = check_data_identity(*d.train, run.data.tokenizer, run.data.layout, run.model.vocab_size, &d.note);
  if (d.validation) {
    const uint64_t v = check_data_identity(*d.validation, run.data.tokenizer, run.data.layout, run.model.vocab_size);
    if (v != 0 && d.tokenizer_hash != 0 && v != d.tokenizer_hash)
      throw Error(run.data.validation + ": the validation shards were tokenized with another tokenizer than the training shards");
  }
  return d;
}

// The run directory, locked by rank 0 for the run's life (one trainer per directory), the
// checkpoint to resume from, and the resolved config.
void take_run_directory(const RunConfig& run, const TrainOptions& opt, Comm& comm, RunParts& p) {
  if (comm.root()) {
    make_directories(run.output_dir);
    p.lock = std::make_unique<RunDirLock>(run.output_dir);
    remove_stale_checkpoint_temporaries(run.output_dir);  // left by a trainer that died while writing one
  }
  comm.barrier();  // no rank reads the directory before rank 0 holds it
  const bool resuming = opt.resume || !opt.resume_from.empty();
  if (!opt.resume_from.empty() && ::access((opt.resume_from + "/trainer_state.json").c_str(), F_OK) != 0) {
    const std::string newest = latest_checkpoint(opt.resume_from);
    throw Error("--resume-from " + opt.resume_from + ": not a checkpoint directory" +
                (newest.empty() ? std::string(" (no trainer_state.json)")
                                : ", but a run directory: pass one of its checkpoints, e.g. --resume-from " + newest + ", or --resume for its latest"));
  }
  p.resume_from = opt.resume_from.empty() ? latest_checkpoint(run.output_dir) : opt.resume_from;
  if (!p.resume_from.empty() && !resuming)
    throw Error(run.output_dir + " already holds checkpoints (" + p.resume_from + "): pass --resume, or another output_dir");
  if (comm.root()) write_text_file_atomic(run.output_dir + "/config.json", run.resolved.dump(2) + "\n");
}

// The backend, the model, data parallelism (gradients in buckets through the backend's
// communicator: MPI on host memory, NCCL on a GPU; each tensor updated by its owner when the
// optimizer is sharded), the optimizer and the update pipeline over them.
void build_model_and_optimizer(const RunConfig& run, Comm& comm, RunParts& p) {
  p.backend = make_backend(p.choice, static_cast<int>(run.threads));
  p.model = std::make_unique<LlamaModel>(*p.backend, run.model, run.precision.params, run.batch.micro_batch, run.batch.seq_len,
                                         run.precision.grads);
  p.model->set_graphs(run.cuda_graphs);
  if (run.model_init_from.empty()) {
    p.model->init_random(static_cast<uint64_t>(run.seed));
  } else {
    const auto verify = verify_reads_of(run.model_init_from);  // a checkpoint: its files checked as they are read
    load_hf_model(p.model->store(), run.model, run.model_init_from);
  }
  ParamStore& params = p.model->store();
  p.grad_comm = make_gradient_communicator(*p.backend, comm);
  p.plan = plan_shards(assign_optimizers(params.tensors(), run.optimizer), run, comm.size(), comm.rank(), run.parallel.shard_optimizer);
  p.optimizer = std::make_unique<Optimizer>(params, run, OptimizerSharding{p.plan, p.grad_comm.get(), &comm});
  p.optimizer->set_graphs(run.cuda_graphs);
  p.grad_sync = std::make_unique<GradientSync>(params, *p.grad_comm, p.plan, static_cast<int64_t>(run.parallel.bucket_mb * 1048576.0),
                                               run.parallel.overlap, run.parallel.staging_buckets);
  p.pipeline = std::make_unique<UpdatePipeline>(*p.model, *p.optimizer, *p.grad_sync, comm, run.batch.loss_normalization, p.accum);
}

}  // namespace

RunParts assemble_run(const RunConfig& run, const TrainOptions& opt, Comm& comm, int64_t last_update) {
  RunParts p;
  p.choice = choose_backend(run.backend);
  comm.set_timeout(run.parallel.timeout_s);
  Comm::set_activity("start-up");
  check_config(run, comm.size());
  p.accum = run.batch.global_batch / (run.batch.micro_batch * comm.size());
  p.data = open_data(run);
  take_run_directory(run, opt, comm, p);
  build_model_and_optimizer(run, comm, p);
  p.checkpointer = std::make_unique<Checkpointer>(run, p.model->store(), *p.optimizer, comm, p.resume_from);
  p.log = std::make_unique<RunLog>(run.output_dir, comm.root(), opt.quiet, run.log_every, last_update, run.log_tensorboard);
  return p;
}

}  // namespace multinorm
