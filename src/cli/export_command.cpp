// `multinorm export`: write a model in Hugging Face form (model.safetensors + config.json) from a
// checkpoint, a run directory, another HF directory or a seeded init, with the tokenizer it was
// trained with (tokenizer.model, tokenizer_config.json, generation_config.json: hf_tokenizer.h).
#include <CLI/CLI.hpp>

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "multinorm/checkpoint.h"
#include "multinorm/cli.h"
#include "multinorm/device.h"
#include "multinorm/hf_tokenizer.h"
#include "multinorm/json_file.h"
#include "multinorm/llama_model.h"
#include "multinorm/model_io.h"
#include "multinorm/run_config.h"
#include "multinorm/safetensors.h"
#include "multinorm/shard.h"
#include "multinorm/trainer.h"

namespace multinorm {

namespace {

// The tokenizer to export beside the weights: --tokenizer, else the one the checkpoint's run (or the
// run config) trained with; a checkpoint that recorded its tokenizer refuses another. "" when none.
std::string tokenizer_to_export(const std::string& given, const std::string& checkpoint, const std::string& run_tokenizer) {
  std::string tok = given, recorded_by = "--config's data.tokenizer";
  if (tok.empty() && !checkpoint.empty() && ::access((checkpoint + "/run_config.json").c_str(), R_OK) == 0) {
    tok = read_json_file(checkpoint + "/run_config.json")["data"].value("tokenizer", "");
    recorded_by = checkpoint + "/run_config.json's data.tokenizer";
  }
  if (tok.empty()) tok = run_tokenizer;
  if (tok.empty()) return "";
  if (::access(tok.c_str(), R_OK) != 0)
    throw Error("export: the tokenizer " + tok + (given.empty() ? " (" + recorded_by + ")" : "") +
                " does not exist (or cannot be read): pass the one the model was trained with as --tokenizer");
  if (!checkpoint.empty() && ::access((checkpoint + "/trainer_state.json").c_str(), R_OK) == 0) {
    const std::string h = read_json_file(checkpoint + "/trainer_state.json").value("tokenizer_hash", std::string("0"));
    if (h != "0" && std::to_string(file_fingerprint(tok)) != h)
      throw Error("export: " + tok + " is not the tokenizer " + checkpoint + " was trained with (its shards recorded another)");
  }
  return tok;
}

// `--logits N`: this build's FP32 logits of the exported weights on N fixed tokens, next to them in
// multinorm_logits.safetensors ("tokens" [1, N] as FP32, "logits" [1, N, V]), so that a loader on
// another framework can be checked against what we compute (scripts/gpu_check.sh: transformers). The
// weights are read back from the export first: a BF16 export is compared as it was written.
void write_logits(LlamaModel& model, const std::string& out, int64_t n) {
  const int64_t V = model.config().vocab_size;
  load_hf_model(model.store(), model.config(), out);
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) tokens[i] = static_cast<int32_t>((i * 7919 + 13) % V);  // spread over the vocabulary
  std::vector<float> logits(static_cast<size_t>(n * V)), token_values(tokens.begin(), tokens.end());
  model.logits({tokens.data(), nullptr, nullptr, 1, n}, logits.data());
  write_safetensors(out + "/multinorm_logits.safetensors",
                    {from_f32_vector("tokens", {1, n}, token_values.data(), DType::F32),
                     from_f32_vector("logits", {1, n, V}, logits.data(), DType::F32)},
                    {{"backend", model.backend().name()}});
  std::printf("wrote %s/multinorm_logits.safetensors (FP32 logits of %lld tokens on the %s backend)\n", out.c_str(), (long long)n,
              model.backend().name().c_str());
}

}  // namespace

void add_export_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("export", "Write a Hugging Face model directory: model.safetensors, config.json, the tokenizer and its configs");
  cmd->footer("Example: multinorm export --config runs/c4_llama_60m_sinkgd/config.json --from runs/c4_llama_60m_sinkgd --out hf/llama_60m_sinkgd");
  static std::string config, from, out, dtype = "bf16";
  static int64_t seed = -1;
  cmd->add_option("--config,-c", config, "run config (its model and seed), model config, or a shipped model's name (llama_1b)")
      ->required()
      ->transform(model_config_path);
  cmd->add_option("--from", from,
                  "weights to export: a checkpoint directory, a run directory (its latest checkpoint) or a Hugging Face directory (default: a "
                  "seeded random init)");
  cmd->add_option("--seed", seed, "init seed (default: the run config's seed, else 0)");
  cmd->add_option("--out,-o", out, "output directory")->required();
  cmd->add_option("--dtype", dtype, "bf16 or fp32")->check(CLI::IsMember({"bf16", "fp32"}));
  static std::string tokenizer;
  static int64_t logits_tokens = 0;
  cmd->add_option("--logits", logits_tokens,
                  "also write multinorm_logits.safetensors: our FP32 logits of the exported weights on this many fixed tokens "
                  "(to check another loader against)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--tokenizer", tokenizer, "SentencePiece model to export with the weights (default: the one the run trained with)");
  cmd->callback([] {
    const json doc = read_json_file(config);
    ModelConfig model_cfg;
    int64_t run_seed = 0;
    std::string run_tokenizer;
    BackendRequest backend = BackendRequest::Auto;  // the run's backend when the config is a run config
    if (is_model_config(doc)) {
      model_cfg = load_model_config(config);
    } else {
      const RunConfig run = load_run_config(config);
      model_cfg = run.model;
      run_seed = run.seed;
      backend = run.backend;
      run_tokenizer = run.data.tokenizer;
    }
    auto be = make_backend(choose_backend(backend), 0);
    if (logits_tokens > model_cfg.max_position_embeddings)
      throw ConfigError("export --logits " + std::to_string(logits_tokens) + ": more than the model's max_position_embeddings (" +
                        std::to_string(model_cfg.max_position_embeddings) + ")");
    LlamaModel model(*be, model_cfg, DType::F32, 1, std::max<int64_t>(2, logits_tokens));
    if (from.empty()) model.init_random(static_cast<uint64_t>(seed >= 0 ? seed : run_seed));
    else {
      from = checkpoint_to_read(from, "--from");  // a run directory: its newest
      const auto verify = verify_reads_of(from);  // a checkpoint: its files checked as they are read
      load_hf_model(model.store(), model.config(), from);
    }
    const std::string tok = tokenizer_to_export(tokenizer, from, run_tokenizer);
    save_hf_model(model.store(), model.config(), out, parse_dtype(dtype));
    std::printf("wrote %s/model.safetensors (%lld parameters, %s) and %s/config.json\n", out.c_str(),
                (long long)model.num_params(), dtype.c_str(), out.c_str());
    if (logits_tokens > 0) write_logits(model, out, logits_tokens);
    if (tok.empty()) {
      std::printf("no tokenizer exported (none configured): pass --tokenizer to write tokenizer.model and its configs\n");
      return;
    }
    write_hf_tokenizer(tok, out, model_cfg.vocab_size, model_cfg.max_position_embeddings);
    std::printf("wrote %s/tokenizer.model (from %s), tokenizer_config.json, special_tokens_map.json, generation_config.json\n",
                out.c_str(), tok.c_str());
  });
}

}  // namespace multinorm
