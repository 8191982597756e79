// Run configs: the schema of every key (with its default and meaning), loading, --set overrides
// and the cross-key checks that a single key's type and range cannot express.
#include "multinorm/run_config.h"

#include <algorithm>
#include <cmath>

#include "multinorm/cuda_scratch.h"
#include "multinorm/error.h"
#include "multinorm/json_file.h"

namespace multinorm {

namespace {
std::string dir_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

std::string stem_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  const auto dot = base.rfind('.');
  return dot == std::string::npos ? base : base.substr(0, dot);
}

// The optimizers that serve the embedding, norms and lm_head (not the matrix-only ones).
std::vector<std::string> fallback_optimizers() {
  return {choice_name(OptimizerKind::Adam), choice_name(OptimizerKind::AdamW), choice_name(OptimizerKind::Sgd)};
}

// A choice the schema validated, as its enum.
template <class E>
E choice_at(const json& v) {
  return parse_choice<E>(v.get<std::string>(), "run config");
}

json default_matrix_params() {
  return json::array({"model.layers.*.self_attn.q_proj.weight", "model.layers.*.self_attn.k_proj.weight",
                      "model.layers.*.self_attn.v_proj.weight", "model.layers.*.self_attn.o_proj.weight",
                      "model.layers.*.mlp.gate_proj.weight", "model.layers.*.mlp.up_proj.weight",
                      "model.layers.*.mlp.down_proj.weight"});
}
}  // namespace

DType parse_dtype(const std::string& name) {
  if (name == "fp32") return DType::F32;
  if (name == "bf16") return DType::BF16;
  throw ConfigError("unknown dtype '" + name + "' (expected fp32 or bf16)");
}

const Schema& run_schema() {
  using namespace keys;
  constexpr double kMaxInt = 9.007199254740992e15;  // 2^53: exact in a JSON double
  static const Schema schema("run", {
      string("name", "", "run name; empty: the config file's stem"),
      required("model.config", ValueKind::ModelRef, "model config: a shipped model's name (llama_60m ... llama_7b), a path relative to this file (relative to the working directory when given with --set), or an inline object"),
      string("model.init_from", "", "start from a Hugging Face-format directory (model.safetensors + config.json) instead of a random init"),
      string("data.train", "", "glob of training token shards (relative to the working directory)"),
      string("data.validation", "", "glob of validation token shards"),
      string("data.tokenizer", "", "SentencePiece model, for decoding and sampling"),
      choice("data.layout", "rows", {layout_name(ShardLayout::Rows), layout_name(ShardLayout::Stream)}, "rows: one document per sequence, EOS, truncated, padded (the paper); stream: packed documents"),
      boolean("data.shuffle", true, "shuffle training sequences (deterministic from seed)"),
      integer("data.prefetch", 4, "micro-batches prepared ahead by the loader thread", 1, 1024),
      integer("batch.global_batch", 512, "sequences per optimizer update, summed over all ranks", 1, 1 << 30),
      integer("batch.micro_batch", 16, "sequences per forward/backward on one rank; gradient accumulation makes up the rest", 1, 1 << 20),
      integer("batch.seq_len", 256, "tokens per sequence", 2, 1 << 20),
      choice("batch.loss_normalization", "micro_batch_mean", choice_names(LossNormalization{}), "micro_batch_mean: mean of per-micro-batch mean losses (GaLore); token_mean: mean over every non-pad target of the update"),
      choice("optimizer.name", "sinkgd", choice_names(OptimizerKind{}), "optimizer of the matrix parameters (optimizer.matrix_params)"),
      choice("optimizer.fallback", "adam", fallback_optimizers(), "optimizer of every other parameter (embedding, norms, lm_head)"),
      list("optimizer.matrix_params", default_matrix_params(), "name patterns of the parameters the matrix optimizer takes ('*' matches any characters)"),
      positive("optimizer.lr", 0.02, "peak learning rate of the schedule; fallback parameters use lr_t"),
      positive("optimizer.alpha", 0.05, "matrix parameters use lr_t * alpha when optimizer.name is sinkgd or swan"),
      number("optimizer.weight_decay", 0.0, "weight decay: decoupled (w *= 1 - lr wd) for sinkgd, swan, adamw and sgd; L2 (g += wd w) for adam, as torch.optim.Adam", 0, 1),
      number("optimizer.grad_clip", 0.0, "clip the global gradient norm to this value; 0 = off", 0),
      choice("optimizer.rounding", "nearest", choice_names(Rounding{}), "BF16 weight write-back: round to nearest even, or stochastic"),
      number("optimizer.momentum", 0.0, "sgd momentum; 0 = stateless", 0, 1),
      integer("optimizer.sinkgd.iterations", 5, "L: alternating row/column normalisations per step", 1, 1000),
      positive("optimizer.sinkgd.eps", 1e-8, "floor on row/column norms, so zero rows/columns give zero updates", 1),
      choice("optimizer.swan.row_norm", "l2", choice_names(SwanRowNorm{}), "l2: rows to norm sqrt(n) (this paper); standardize: subtract mean, divide by std (SWAN paper)"),
      choice("optimizer.swan.whitening", "newton_schulz", choice_names(SwanWhitening{}), "(X X^T)^(-1/2) by Newton-Schulz (FP32; on a GPU see ns_products) or an exact FP64 eigendecomposition"),
      integer("optimizer.swan.ns_steps", 12,
              "Newton-Schulz iterations (a ceiling when ns_tolerance > 0: the scaled steps reach 1e-4 within 10 from any start; 12 leaves FP32 rounding two)", 1, 1000),
      number("optimizer.swan.ns_tolerance", 1e-4, "stop Newton-Schulz once ||I - Z Y||_F / sqrt(k) falls below; 0 = run every step", 0, 1),
      choice("optimizer.swan.ns_products", "auto", choice_names(SwanProducts{}),
             "Newton-Schulz's products on a GPU: fp32, split_tf32 (three TF32 tensor-core products of split operands, ~FP32 accuracy), or auto (split from k = " +
                 std::to_string(cuda_scratch::kSwanSplitTf32MinK) + ", the Gram size min(m, n)); the CPU computes FP32"),
      positive("optimizer.swan.eps", 1e-8, "floor on row norms and the Gram scaling", 1),
      below("optimizer.adam.beta1", 0.9, "Adam first-moment decay (< 1: the bias correction divides by 1 - beta1^t)", 0, 1),
      below("optimizer.adam.beta2", 0.999, "Adam second-moment decay (< 1: the bias correction divides by 1 - beta2^t)", 0, 1),
      positive("optimizer.adam.eps", 1e-8, "Adam epsilon, added to sqrt(v_hat)", 1),
      choice("schedule.kind", "cosine", choice_names(ScheduleKind{}), "lr multiplier after the linear warmup: cosine or linear decay to min_lr_ratio, or constant"),
      integer("schedule.total_steps", 10000, "optimizer updates in the run", 1, kMaxInt),
      integer("schedule.warmup_steps", nullptr, "warmup updates; unset: warmup_ratio * total_steps", 0, kMaxInt),
      number("schedule.warmup_ratio", 0.1, "warmup as a fraction of total_steps (when warmup_steps is unset)", 0, 1),
      number("schedule.min_lr_ratio", 0.1, "final lr multiplier", 0, 1),
      boolean("schedule.galore_offset", false, "GaLore compatibility: update k uses mult(k-1), so the first update runs at lr 0"),
      integer("eval.every", 1000, "evaluate every N updates (and at the end); 0 = only at the end", 0, kMaxInt),
      integer("eval.tokens", 10000000, "stop evaluating after this many non-pad target tokens (the paper: 10M)", 1, kMaxInt),
      integer("eval.micro_batch", nullptr, "sequences per evaluation forward; unset: batch.micro_batch", 1, 1 << 20),
      integer("checkpoint.every", 1000, "write a checkpoint every N updates (and at the end); 0 = only at the end", 0, kMaxInt),
      integer("checkpoint.keep_last", 2, "checkpoints kept; older ones are deleted", 1, 1 << 20),
      choice("precision.params", "bf16", {"bf16", "fp32"}, "storage of weights and activations (the paper: bf16); fp32 for verification"),
      choice("precision.grads", "params", {"params", "fp32"}, "gradient arena: params (as the weights; bf16 rounds every partial sum of gradient accumulation, the paper's protocol) or fp32 (FP32 gradients with bf16 weights, as llm.c and torchtitan)"),
      choice("precision.optimizer_states", "bf16", {"bf16", "fp32"}, "storage of optimizer states (Adam m and v, SGD momentum)"),
      positive("parallel.bucket_mb", 25.0, "data parallelism: gradients are reduced in buckets of about this many MiB (FP32), whole layers", 1 << 20),
      boolean("parallel.overlap", true, "reduce each bucket as soon as the last micro-batch's backward pass has finished its layers, hidden under the layers below"),
      integer("parallel.staging_buckets", 2, "BF16 gradients are summed in FP32 staging of this many buckets: the backward pass runs at most this many buckets ahead of the reduction (more hides a slower network, at a bucket of FP32 each)", 1, 64),
      boolean("parallel.shard_optimizer", true, "ZeRO-1: each tensor is updated by one rank (balanced by cost), which alone keeps its optimizer state and broadcasts the new weights"),
      positive("parallel.timeout_s", 600.0, "a collective that waits longer than this for the other ranks ends the run, naming the rank and the update", 1e7),
      choice("divergence.action", "stop", choice_names(DivergenceAction{}), "when an update's loss or gradient norm is not finite, or the divergence monitor trips: stop (exit status 3, result.json says diverged), skip the update (a non-finite or spiking update is not applied; the other trips stop), or roll back to the last good checkpoint with a lower learning rate"),
      boolean("divergence.zero_grad_norm", true, "trip on a gradient norm of exactly zero (a trainable model never has one on real data)"),
      number("divergence.spike_factor", 3.0, "trip when an update's loss exceeds this times the median of the last spike_window losses; 0 = off", 0),
      integer("divergence.spike_window", 100, "losses the spike test's median is taken over", 1, 1 << 30),
      integer("divergence.stuck_evals", 3, "trip when this many evaluations in a row (the training loss at the evaluation points without validation data) sit at or above the initial loss ln V; 0 = off", 0, 1 << 30),
      below("divergence.rollback_lr_factor", 0.5, "rollback: the learning rate is multiplied by this at each rollback", 0, 1),
      integer("divergence.max_rollbacks", 3, "rollback: after this many, a trip stops the run", 0, 1 << 30),
      integer("divergence.max_consecutive_skips", 3, "skip: this many skipped updates in a row stop the run (weights that went non-finite make every later update non-finite)", 1, 1 << 30),
      choice("backend", "auto", choice_names(BackendRequest{}), "auto: CUDA when a GPU is usable, else the CPU"),
      integer("threads", 0, "CPU threads (OpenMP); 0 = all cores", 0, 4096),
      boolean("cuda_graphs", true, "CUDA backend: record a micro-batch's forward and backward, and the optimizer's update, once as CUDA graphs and replay them (one launch instead of hundreds)"),
      integer("seed", 0, "seed of the init, the data order and stochastic rounding", 0, kMaxInt),
      string("output_dir", "", "run directory; empty: runs/<name>"),
      integer("log.every", 1, "print a log line every N updates (metrics.jsonl gets every update)", 1, kMaxInt),
      boolean("log.tensorboard", true, "write TensorBoard event files beside metrics.jsonl (tensorboard --logdir runs/; wandb sync --sync-tensorboard)"),
      string("paper.table", "", "configs/c4: where in the paper this recipe's figure is (\"Table 1\")"),
      string("paper.row", "", "configs/c4: the paper's name of the row (Adam, SWAN, SWAN†, SinkGD)"),
      number("paper.perplexity", 0.0, "configs/c4: the paper's C4 validation perplexity for this recipe; `compare` prints it beside a run that matches the recipe (0: none)", 0),
      string("paper.setup", "", "configs/c4: the GPUs and batch split the paper ran this recipe on (micro-batch x accumulation x GPUs)"),
  });
  return schema;
}

void check_batch_over_ranks(const RunConfig& run, int64_t ranks) {
  if (run.batch.global_batch % (run.batch.micro_batch * ranks) == 0) return;
  int64_t fits = 0;  // the largest micro-batch that would split it (a divisor of global_batch / ranks)
  if (run.batch.global_batch % ranks == 0)
    for (int64_t m = std::min(run.batch.micro_batch, run.batch.global_batch / ranks); m >= 1 && fits == 0; --m)
      if ((run.batch.global_batch / ranks) % m == 0) fits = m;
  throw ConfigError(run.source + ": batch.global_batch " + std::to_string(run.batch.global_batch) +
                    " is not a multiple of batch.micro_batch x ranks = " + std::to_string(run.batch.micro_batch) + " x " +
                    std::to_string(ranks) +
                    (fits ? " (on " + std::to_string(ranks) + " ranks: --set batch.micro_batch=" + std::to_string(fits) + ")" : ""));
}

bool is_model_config(const json& doc) { return doc.is_object() && doc.contains("hidden_size"); }

json used_optimizer_settings(const json& o) {
  // the settings section each optimizer reads; SGD's momentum is a top-level key
  const auto section = [](const std::string& name) { return name == "adamw" ? std::string("adam") : name == "sgd" ? std::string() : name; };
  const std::string mine = section(o.at("name").get<std::string>()), fallback = section(o.at("fallback").get<std::string>());
  json used = o;
  for (const char* s : {"sinkgd", "swan", "adam"})
    if (s != mine && s != fallback) used.erase(s);
  return used;
}

RunConfig run_config_from_json(const json& doc_in, const std::string& source, const std::vector<std::string>& overrides) {
  const Schema& schema = run_schema();
  if (!doc_in.is_object()) throw ConfigError(source + ": expected a JSON object at the top level");
  json doc = doc_in;
  bool model_from_command_line = false;  // a relative model.config then resolves against the working directory
  for (const auto& text : overrides) {
    auto [key, value] = parse_override(text);
    schema.apply_override(doc, key, value, "--set " + text);
    if (key == "model.config") model_from_command_line = true;
  }
  json r = schema.resolve(doc, source);

  RunConfig c;
  c.source = source;
  c.name = r["name"].get<std::string>();
  if (c.name.empty()) c.name = stem_of(source);

  // The model: a shipped model's name (llama_1b), a path (relative to this config file, or to the
  // working directory when --set gives it), or an inline object. The resolved config inlines it so
  // that a run directory is self-contained.
  const json& ref = r["model"]["config"];
  if (ref.is_string()) {
    std::string path = model_config_path(ref.get<std::string>());
    if (!path.empty() && path[0] != '/' && !model_from_command_line) path = dir_of(source) + "/" + path;
    try {
      c.model = load_model_config(path);
    } catch (const ConfigError& e) {
      throw ConfigError(source + ": model.config: " + e.what());
    }
    r["model"]["config"] = model_schema().resolve(read_json_file(path), path);
  } else {
    c.model = model_config_from_json(ref, source + ": model.config", "inline");
    r["model"]["config"] = model_schema().resolve(ref, source + ": model.config");
  }
  c.model_init_from = r["model"]["init_from"].get<std::string>();

  const json& d = r["data"];
  c.data.train = d["train"].get<std::string>();
  c.data.validation = d["validation"].get<std::string>();
  c.data.tokenizer = d["tokenizer"].get<std::string>();
  c.data.layout = parse_layout(d["layout"].get<std::string>());
  c.data.shuffle = d["shuffle"].get<bool>();
  c.data.prefetch = d["prefetch"].get<int64_t>();

  const json& b = r["batch"];
  c.batch.global_batch = b["global_batch"].get<int64_t>();
  c.batch.micro_batch = b["micro_batch"].get<int64_t>();
  c.batch.seq_len = b["seq_len"].get<int64_t>();
  c.batch.loss_normalization = choice_at<LossNormalization>(b["loss_normalization"]);

  const json& o = r["optimizer"];
  c.optimizer.name = choice_at<OptimizerKind>(o["name"]);
  c.optimizer.fallback = choice_at<OptimizerKind>(o["fallback"]);
  c.optimizer.matrix_params = o["matrix_params"].get<std::vector<std::string>>();
  c.optimizer.lr = o["lr"].get<double>();
  c.optimizer.alpha = o["alpha"].get<double>();
  c.optimizer.weight_decay = o["weight_decay"].get<double>();
  c.optimizer.grad_clip = o["grad_clip"].get<double>();
  c.optimizer.rounding = choice_at<Rounding>(o["rounding"]);
  c.optimizer.momentum = o["momentum"].get<double>();
  c.optimizer.sinkgd.iterations = o["sinkgd"]["iterations"].get<int64_t>();
  c.optimizer.sinkgd.eps = o["sinkgd"]["eps"].get<double>();
  c.optimizer.swan.row_norm = choice_at<SwanRowNorm>(o["swan"]["row_norm"]);
  c.optimizer.swan.whitening = choice_at<SwanWhitening>(o["swan"]["whitening"]);
  c.optimizer.swan.ns_steps = o["swan"]["ns_steps"].get<int64_t>();
  c.optimizer.swan.ns_tolerance = o["swan"]["ns_tolerance"].get<double>();
  c.optimizer.swan.ns_products = choice_at<SwanProducts>(o["swan"]["ns_products"]);
  c.optimizer.swan.eps = o["swan"]["eps"].get<double>();
  c.optimizer.adam.beta1 = o["adam"]["beta1"].get<double>();
  c.optimizer.adam.beta2 = o["adam"]["beta2"].get<double>();
  c.optimizer.adam.eps = o["adam"]["eps"].get<double>();

  const json& s = r["schedule"];
  c.schedule.kind = choice_at<ScheduleKind>(s["kind"]);
  c.schedule.total_steps = s["total_steps"].get<int64_t>();
  c.schedule.warmup_steps = s["warmup_steps"].is_null()
                                ? static_cast<int64_t>(std::llround(s["warmup_ratio"].get<double>() * c.schedule.total_steps))
                                : s["warmup_steps"].get<int64_t>();
  c.schedule.min_lr_ratio = s["min_lr_ratio"].get<double>();
  c.schedule.galore_offset = s["galore_offset"].get<bool>();

  c.eval.every = r["eval"]["every"].get<int64_t>();
  c.eval.tokens = r["eval"]["tokens"].get<int64_t>();
  c.eval.micro_batch = r["eval"]["micro_batch"].is_null() ? c.batch.micro_batch : r["eval"]["micro_batch"].get<int64_t>();
  c.checkpoint.every = r["checkpoint"]["every"].get<int64_t>();
  c.checkpoint.keep_last = r["checkpoint"]["keep_last"].get<int64_t>();
  c.precision.params = parse_dtype(r["precision"]["params"].get<std::string>());
  c.precision.grads = r["precision"]["grads"].get<std::string>() == "fp32" ? DType::F32 : c.precision.params;
  c.precision.optimizer_states = parse_dtype(r["precision"]["optimizer_states"].get<std::string>());
  c.parallel.bucket_mb = r["parallel"]["bucket_mb"].get<double>();
  c.parallel.overlap = r["parallel"]["overlap"].get<bool>();
  c.parallel.staging_buckets = r["parallel"]["staging_buckets"].get<int64_t>();
  c.parallel.shard_optimizer = r["parallel"]["shard_optimizer"].get<bool>();
  c.parallel.timeout_s = r["parallel"]["timeout_s"].get<double>();
  const json& dv = r["divergence"];
  c.divergence.action = choice_at<DivergenceAction>(dv["action"]);
  c.divergence.zero_grad_norm = dv["zero_grad_norm"].get<bool>();
  c.divergence.spike_factor = dv["spike_factor"].get<double>();
  c.divergence.spike_window = dv["spike_window"].get<int64_t>();
  c.divergence.stuck_evals = dv["stuck_evals"].get<int64_t>();
  c.divergence.rollback_lr_factor = dv["rollback_lr_factor"].get<double>();
  c.divergence.max_rollbacks = dv["max_rollbacks"].get<int64_t>();
  c.divergence.max_consecutive_skips = dv["max_consecutive_skips"].get<int64_t>();
  c.backend = choice_at<BackendRequest>(r["backend"]);
  c.threads = r["threads"].get<int64_t>();
  c.cuda_graphs = r["cuda_graphs"].get<bool>();
  c.seed = r["seed"].get<int64_t>();
  c.output_dir = r["output_dir"].get<std::string>();
  if (c.output_dir.empty()) c.output_dir = "runs/" + c.name;
  c.log_every = r["log"]["every"].get<int64_t>();
  c.log_tensorboard = r["log"]["tensorboard"].get<bool>();

  // Cross-key checks.
  auto bad = [&](const std::string& key, const std::string& why) { throw ConfigError(source + ": " + key + ": " + why); };
  if (c.batch.global_batch % c.batch.micro_batch != 0)
    bad("batch.global_batch", std::to_string(c.batch.global_batch) + " is not a multiple of batch.micro_batch " +
                                  std::to_string(c.batch.micro_batch));
  if (c.batch.seq_len > c.model.max_position_embeddings)
    bad("batch.seq_len", std::to_string(c.batch.seq_len) + " exceeds the model's max_position_embeddings " +
                             std::to_string(c.model.max_position_embeddings));
  if (c.schedule.warmup_steps > c.schedule.total_steps)
    bad("schedule.warmup_steps", std::to_string(c.schedule.warmup_steps) + " exceeds schedule.total_steps " +
                                     std::to_string(c.schedule.total_steps));
  if (c.optimizer.matrix_params.empty() && (c.optimizer.name == OptimizerKind::SinkGD || c.optimizer.name == OptimizerKind::Swan))
    bad("optimizer.matrix_params", "is empty: " + choice_name(c.optimizer.name) + " would take no parameter");

  c.resolved = r;
  return c;
}

RunConfig load_run_config(const std::string& path, const std::vector<std::string>& overrides) {
  const json doc = read_json_file(path);
  if (is_model_config(doc))
    throw ConfigError(path + ": this is a model config (it has hidden_size); a run config references one under model.config");
  return run_config_from_json(doc, path, overrides);
}

}  // namespace multinorm
