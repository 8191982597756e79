// A training run's parts, assembled in order by assemble_run(): the config's cross-key rules and the
// data (shards, tokenizer, layout, vocabulary) are checked before the run directory is created or
// locked; then the backend, the model, data parallelism, the optimizer, the update pipeline, the
// checkpointer and the run log. TrainingRun (training_run.h) holds them and the loop's state.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "checkpointer.h"
#include "multinorm/data_parallel.h"
#include "multinorm/device.h"
#include "multinorm/loader.h"
#include "multinorm/llama_model.h"
#include "multinorm/optimizer.h"
#include "multinorm/run_lock.h"
#include "multinorm/trainer.h"
#include "multinorm/update_pipeline.h"
#include "run_log.h"

namespace multinorm {

// The run's shards, checked against its tokenizer, layout and vocabulary.
struct RunData {
  std::shared_ptr<const ShardSet> train, validation;  // validation: null when none is configured
  uint64_t tokenizer_hash = 0;                        // of the shards' tokenizer (0: unknown)
  std::string note;                                   // a line for the log about the data's identity ("" : none)
};

// Declared in the order they are built (and destroyed in reverse).
struct RunParts {
  BackendChoice choice;
  int64_t accum = 0;  // micro-batches an update on each rank
  RunData data;
  std::unique_ptr<RunDirLock> lock;  // rank 0's, for the run's life
  std::string resume_from;           // the checkpoint this run resumes from ("" when fresh)
  std::unique_ptr<Backend> backend;
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<Communicator> grad_comm;
  ShardPlan plan;
  std::unique_ptr<Optimizer> optimizer;
  std::unique_ptr<GradientSync> grad_sync;
  std::unique_ptr<UpdatePipeline> pipeline;
  std::unique_ptr<Checkpointer> checkpointer;
  std::unique_ptr<RunLog> log;
};

// `last_update`: the last update this process runs (the run log's progress line counts to it).
RunParts assemble_run(const RunConfig& run, const TrainOptions& opt, Comm& comm, int64_t last_update);

}  // namespace multinorm
