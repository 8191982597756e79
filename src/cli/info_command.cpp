// `multinorm info --config <model or run config>`: parameter counts by tensor group, the paper's
// memory table (weights + optimizer states, BF16), and the training memory of one rank.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <map>

#include "multinorm/cli.h"
#include "multinorm/data_parallel.h"
#include "multinorm/kernel_costs.h"
#include "multinorm/llama_model.h"
#include "multinorm/device.h"
#include "multinorm/error.h"
#include "multinorm/model_config.h"
#include "multinorm/json_file.h"
#include "multinorm/memory_estimate.h"
#include "multinorm/param_groups.h"
#include "multinorm/run_config.h"
#include "multinorm/shard_plan.h"

namespace multinorm {

std::string with_commas(int64_t n) {
  std::string s = std::to_string(n < 0 ? -n : n), out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i && (s.size() - i) % 3 == 0) out += ',';
    out += s[i];
  }
  return n < 0 ? "-" + out : out;
}

namespace {

struct InfoOptions {
  std::string path;
  std::vector<std::string> overrides;
  int64_t micro_batch = 0, seq_len = 0;
  int ranks = 1;
  bool as_json = false;
};

double gib(int64_t bytes) { return static_cast<double>(bytes) / kGiB; }

void run_info(const InfoOptions& o) {
  const json doc = read_json_file(o.path);
  RunConfig run;
  const bool is_run = !is_model_config(doc);
  if (is_run) {
    run = run_config_from_json(doc, o.path, o.overrides);
  } else {
    if (!o.overrides.empty()) throw ConfigError("--set applies to run configs; " + o.path + " is a model config");
    // A model config alone: describe it under the run defaults (SinkGD, BF16, micro-batch 16 x 256).
    json stub = {{"model", {{"config", doc}}}};
    run = run_config_from_json(stub, o.path);
    run.model.name = load_model_config(o.path).name;
  }
  if (o.micro_batch > 0) run.batch.micro_batch = o.micro_batch;
  if (o.seq_len > 0) run.batch.seq_len = o.seq_len;
  if (is_run) check_batch_over_ranks(run, o.ranks);  // what `train` would refuse on that many ranks

  const ModelConfig& m = run.model;
  const auto specs = llama_parameters(m);
  std::map<TensorGroup, int64_t> by_group;
  for (const auto& s : specs) by_group[s.group()] += s.numel();
  const int64_t total = count_parameters(specs);
  int64_t matrix = 0;
  for (const auto& a : assign_optimizers(specs, run.optimizer)) matrix += a.matrix ? a.tensor->numel() : 0;
  const auto table = paper_memory_table(m);
  // The CUDA backend's device plan when the run asks for cuda (planned even on a machine without a
  // GPU), or when auto would pick it here.
  const bool cuda_plan =
      run.backend == BackendRequest::Cuda || (run.backend == BackendRequest::Auto && choose_backend(BackendRequest::Auto).kind == BackendKind::Cuda);
  const TrainingMemory tm = training_memory(run, cuda_plan);
  const ActivationPlan plan = training_activation_plan(run, cuda_plan);
  // Data parallelism over o.ranks: the optimizer state each rank keeps, replicated and sharded by
  // tensor (the same plan the trainer makes), and the FP32 staging BF16 gradients are reduced in.
  const auto assign = assign_optimizers(specs, run.optimizer);
  const std::vector<int64_t> sharded = state_bytes_per_rank(plan_shards(assign, run, o.ranks, 0, true), assign, run);
  const int64_t sharded_max = *std::max_element(sharded.begin(), sharded.end());
  int64_t staging = 0;
  if (o.ranks > 1) {  // the model's own buckets, on a backend that allocates nothing, in the plan's arena layout
    auto rec = make_cost_recorder(cuda_plan);
    const LlamaModel model(*rec, run.model, run.precision.params, 1, 1, run.precision.grads);
    staging = gradient_staging_bytes(model.store(), static_cast<int64_t>(run.parallel.bucket_mb * 1048576.0), o.ranks, run.parallel.staging_buckets);
  }
  const int64_t per_rank_replicated = tm.total() + staging, per_rank_sharded = tm.total() - tm.states + sharded_max + staging;

  if (o.as_json) {
    json j;
    j["model"] = m.name;
    j["parameters"]["total"] = total;
    for (const auto& [g, n] : by_group) j["parameters"][group_name(g)] = n;
    j["parameters"]["matrix_optimizer"] = matrix;
    j["parameters"]["fallback_optimizer"] = total - matrix;
    for (const auto& r : table)
      j["paper_memory_gib"][r.label] = {{"weights", gib(r.weight_bytes)}, {"states", gib(r.state_bytes)},
                                        {"matrix_states", gib(r.matrix_state_bytes)}, {"total", gib(r.total())}};
    j["training_memory"] = {{"optimizer", choice_name(run.optimizer.name)}, {"fallback", choice_name(run.optimizer.fallback)},
                            {"micro_batch", run.batch.micro_batch}, {"seq_len", run.batch.seq_len},
                            {"precision", dtype_name(run.precision.params)},
                            {"grads_precision", dtype_name(run.precision.grads)},
                            {"weights_bytes", tm.weights}, {"grads_bytes", tm.grads}, {"states_bytes", tm.states},
                            {"activations_bytes", tm.activations}, {"activations_saved_bytes", plan.saved_bytes()},
                            {"backend_scratch_bytes", tm.backend_scratch}, {"memory_of", tm.cuda ? "cuda device" : "cpu host"},
                            {"total_bytes", tm.total()}};
    if (o.ranks > 1)
      j["data_parallel"] = {{"ranks", o.ranks}, {"states_bytes_replicated", tm.states}, {"states_bytes_sharded_per_rank", sharded},
                            {"reduction_staging_bytes", staging}, {"total_bytes_per_rank_replicated", per_rank_replicated},
                            {"total_bytes_per_rank_sharded", per_rank_sharded}};
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }

  std::printf("model %s (%s)\n", m.name.c_str(), is_run ? m.source.c_str() : o.path.c_str());
  std::printf("  vocab %lld, hidden %lld, intermediate %lld, layers %lld, heads %lld (head dim %lld), %s embeddings\n\n",
              (long long)m.vocab_size, (long long)m.hidden_size, (long long)m.intermediate_size,
              (long long)m.num_hidden_layers, (long long)m.num_attention_heads, (long long)m.head_dim(),
              m.tie_word_embeddings ? "tied" : "untied");
  std::printf("parameters                        %15s   share\n", "count");
  for (const auto& [g, n] : by_group)
    std::printf("  %-31s %15s  %5.1f%%\n", group_name(g), with_commas(n).c_str(), 100.0 * n / total);
  std::printf("  %-31s %15s\n", "total", with_commas(total).c_str());
  std::printf("  %-31s %15s  %5.1f%%\n", ("matrix optimizer (" + choice_name(run.optimizer.name) + ")").c_str(),
              with_commas(matrix).c_str(), 100.0 * matrix / total);
  std::printf("  %-31s %15s  %5.1f%%\n\n", ("fallback (" + choice_name(run.optimizer.fallback) + ")").c_str(),
              with_commas(total - matrix).c_str(), 100.0 * (total - matrix) / total);

  std::printf("memory as in the paper: BF16 weights + optimizer states, GiB = 2^30 bytes\n");
  std::printf("  %-8s %9s %9s %9s   %s\n", "method", "weights", "states", "MEM", "state of the matrix params");
  for (const auto& r : table)
    std::printf("  %-8s %9.3f %9.3f %8.2fG   %.3f GiB\n", r.label.c_str(), gib(r.weight_bytes), gib(r.state_bytes),
                gib(r.total()), gib(r.matrix_state_bytes));
  std::printf("  (sinkgd and swan keep Adam states for embedding, norms and lm_head)\n\n");

  std::printf("training memory of one rank: %s + %s, %s weights/activations, %s gradients, %s states,\n"
              "micro-batch %lld x seq %lld\n",
              choice_name(run.optimizer.name).c_str(), choice_name(run.optimizer.fallback).c_str(), dtype_name(run.precision.params),
              dtype_name(run.precision.grads), dtype_name(run.precision.optimizer_states), (long long)run.batch.micro_batch, (long long)run.batch.seq_len);
  std::printf("  %-34s %10.3f GiB\n", "weights", gib(tm.weights));
  std::printf("  %-34s %10.3f GiB\n", "gradients", gib(tm.grads));
  std::printf("  %-34s %10.3f GiB\n", "optimizer states", gib(tm.states));
  std::printf("  %-34s %10.3f GiB\n", "activations (saved for backward)", gib(plan.saved_bytes()));
  std::printf("  %-34s %10.3f GiB\n", "activations (backward scratch)", gib(plan.scratch_bytes()));
  std::printf("  %-34s %10.3f GiB\n", tm.cuda ? "backend scratch (CUDA, device)" : "backend scratch (CPU backend)", gib(tm.backend_scratch));
  std::printf("  %-34s %10.3f GiB\n", "total", gib(tm.total()));
  if (o.ranks > 1) {
    std::printf("\ndata parallel over %d ranks, per rank:\n", o.ranks);
    std::printf("  %-34s %10.3f GiB\n", "optimizer states, replicated", gib(tm.states));
    std::printf("  %-34s %10.3f GiB  (largest share; smallest %.3f)\n", "optimizer states, sharded (ZeRO-1)", gib(sharded_max),
                gib(*std::min_element(sharded.begin(), sharded.end())));
    if (staging) std::printf("  %-34s %10.3f GiB\n", ("FP32 staging (" + std::to_string(run.parallel.staging_buckets) + " gradient buckets)").c_str(), gib(staging));
    std::printf("  %-34s %10.3f GiB replicated, %.3f GiB sharded\n", "total", gib(per_rank_replicated), gib(per_rank_sharded));
    std::printf("  (whole tensors are owned by one rank, balanced by update cost: the embedding's Adam state stays whole)\n");
  }
  if (is_run) {
    std::string backend;
    try {
      backend = choose_backend(run.backend).reason;
    } catch (const Error& e) {
      backend = std::string("unavailable: ") + e.what();
    }
    std::printf("\nbackend %s -> %s\n", choice_name(run.backend).c_str(), backend.c_str());
  }
}

}  // namespace

void add_info_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("info", "Parameter counts and memory (the paper's MEM column, training total)");
  cmd->footer("Example: multinorm info --config configs/c4/llama_1b_sinkgd.json --ranks 8");
  static InfoOptions o;
  cmd->add_option("--config,-c", o.path, "run config, model config, or a shipped model's name (llama_1b)")
      ->required()
      ->transform(model_config_path);
  cmd->add_option("--set", o.overrides, "override a run config key (repeatable)");
  cmd->add_option("--ranks", o.ranks, "data-parallel ranks: per-rank memory with and without the sharded optimizer")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--micro-batch", o.micro_batch, "micro-batch for the activation estimate (default: the run's)");
  cmd->add_option("--seq-len", o.seq_len, "sequence length for the activation estimate (default: the run's)");
  cmd->add_flag("--json", o.as_json, "machine-readable output");
  cmd->callback([] { run_info(o); });
}

}  // namespace multinorm
