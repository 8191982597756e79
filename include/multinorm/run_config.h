// A run: which model, which data, batch, optimizer, schedule, evaluation, checkpoints, precision,
// backend. Configs are data: a JSON file validated against run_schema() (docs/configs.md lists every
// key with its default), plus --set overrides.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "multinorm/config_choices.h"
#include "multinorm/dtype.h"
#include "multinorm/model_config.h"
#include "multinorm/schema.h"
#include "multinorm/shard.h"

namespace multinorm {

struct DataConfig {
  std::string train;       // glob of training shards
  std::string validation;  // glob of validation shards
  std::string tokenizer;   // SentencePiece model
  ShardLayout layout = ShardLayout::Rows;  // one document per row (the paper), or packed
  bool shuffle = true;
  int64_t prefetch = 4;
};

struct BatchConfig {
  int64_t global_batch = 512;  // sequences per update, over all ranks
  int64_t micro_batch = 16;    // sequences per forward/backward on one rank
  int64_t seq_len = 256;
  LossNormalization loss_normalization = LossNormalization::MicroBatchMean;
};

struct SinkGDConfig {
  int64_t iterations = 5;  // L, alternating row/column normalisations
  double eps = 1e-8;       // floor on row/column norms: zero rows/columns give zero updates
};

struct SwanConfig {
  SwanRowNorm row_norm = SwanRowNorm::L2;  // l2 (the multi-normalization paper) or standardize (SWAN paper)
  SwanWhitening whitening = SwanWhitening::NewtonSchulz;  // or eigh (exact, FP64)
  int64_t ns_steps = 12;  // a ceiling: the scaled steps reach 1e-4 within 10 from any start (optim_math::ns_steps_bound)
  double ns_tolerance = 1e-4;
  SwanProducts ns_products = SwanProducts::Auto;  // on a GPU: FP32 or split TF32 products (cuda_scratch::swan_split_tf32)
  double eps = 1e-8;
};

struct AdamConfig {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
};

struct OptimizerConfig {
  OptimizerKind name = OptimizerKind::SinkGD;    // the matrix optimizer
  OptimizerKind fallback = OptimizerKind::Adam;  // optimizer of every parameter not matched by matrix_params
  std::vector<std::string> matrix_params;  // name patterns ('*' matches any run of characters)
  double lr = 0.02;
  double alpha = 0.05;    // matrix parameters run at lr_t * alpha
  double weight_decay = 0.0;
  double grad_clip = 0.0;  // global-norm clipping; 0 = off
  Rounding rounding = Rounding::Nearest;  // BF16 weight write-back
  double momentum = 0.0;  // sgd
  SinkGDConfig sinkgd;
  SwanConfig swan;
  AdamConfig adam;
};

struct ScheduleConfig {
  ScheduleKind kind = ScheduleKind::Cosine;
  int64_t total_steps = 10000;
  int64_t warmup_steps = 1000;  // resolved: warmup_ratio * total_steps when not given
  double min_lr_ratio = 0.1;
  bool galore_offset = false;
};

struct EvalConfig {
  int64_t every = 1000;
  int64_t tokens = 10000000;
  int64_t micro_batch = 16;
};

struct CheckpointConfig {
  int64_t every = 1000;
  int64_t keep_last = 2;
};

struct PrecisionConfig {
  DType params = DType::BF16;  // weights and activations
  DType grads = DType::BF16;   // the gradient arena: params' dtype, or FP32 (precision.grads = fp32)
  DType optimizer_states = DType::BF16;
};

struct ParallelConfig {
  double bucket_mb = 25;        // gradient bucket size, MiB of FP32
  bool overlap = true;          // reduce buckets during the last micro-batch's backward pass
  int64_t staging_buckets = 2;  // FP32 staging slots for BF16 gradients (GradientSync)
  bool shard_optimizer = true;  // ZeRO-1: each tensor updated (and its state kept) by one rank
  double timeout_s = 600;       // a collective waiting longer ends the run, naming rank and update
};

// divergence.*: what the divergence monitor trips on and what a trip does (divergence.h).
struct DivergenceConfig {
  DivergenceAction action = DivergenceAction::Stop;
  bool zero_grad_norm = true;
  double spike_factor = 3.0;  // 0 = off
  int64_t spike_window = 100;
  int64_t stuck_evals = 3;  // 0 = off
  double rollback_lr_factor = 0.5;
  int64_t max_rollbacks = 3;
  int64_t max_consecutive_skips = 3;  // skip: a trip after this many skipped updates in a row
};

struct RunConfig {
  std::string source;  // the file it was read from
  std::string name;
  ModelConfig model;
  std::string model_init_from;
  DataConfig data;
  BatchConfig batch;
  OptimizerConfig optimizer;
  ScheduleConfig schedule;
  EvalConfig eval;
  CheckpointConfig checkpoint;
  PrecisionConfig precision;
  ParallelConfig parallel;
  DivergenceConfig divergence;
  BackendRequest backend = BackendRequest::Auto;
  bool cuda_graphs = true;  // the CUDA backend replays a captured micro-batch and update (LlamaModel::set_graphs, Optimizer::set_graphs)
  int64_t threads = 0;
  int64_t seed = 0;
  std::string output_dir;
  int64_t log_every = 1;
  bool log_tensorboard = true;  // TensorBoard event files beside metrics.jsonl

  json resolved;  // the fully resolved config (model inlined); written into the run directory
};

const Schema& run_schema();

// Reads, validates and resolves a run config; `overrides` are "key=value" strings (from --set).
RunConfig load_run_config(const std::string& path, const std::vector<std::string>& overrides = {});
RunConfig run_config_from_json(const json& doc, const std::string& source,
                               const std::vector<std::string>& overrides = {});

// The rule that needs the rank count: the global batch splits into micro-batches on every rank
// (ConfigError naming the config and the numbers). `train` checks it at start, `info --ranks` too.
void check_batch_over_ranks(const RunConfig& run, int64_t ranks);

// A resolved config's "optimizer" section without the settings of optimizers the run does not use
// (a SinkGD run's "swan"): what two runs must share to be the same optimizer (a checkpoint's
// fingerprint, the paper's recipes), so a default of an unused optimizer may move between versions.
json used_optimizer_settings(const json& resolved_optimizer);

// True when the file at `path` is a model config (has "hidden_size") rather than a run config.
bool is_model_config(const json& doc);

}  // namespace multinorm
