// The LLaMA architecture, read from a Hugging Face LlamaConfig-style JSON file (configs/models/).
#pragma once
#include <cstdint>
#include <string>

#include "multinorm/schema.h"

namespace multinorm {

struct ModelConfig {
  std::string name;    // file stem, e.g. "llama_60m" ("inline" for an inline config)
  std::string source;  // the file it was read from, for messages

  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  double initializer_range = 0.02;
  bool tie_word_embeddings = false;

  int64_t head_dim() const { return hidden_size / num_attention_heads; }

  // The Hugging Face config.json for this model (model_type llama, LlamaForCausalLM).
  json to_hf_json() const;
};

const Schema& model_schema();

// Validates a parsed model config (`source` names it in errors) and checks its internal consistency.
ModelConfig model_config_from_json(const json& doc, const std::string& source, const std::string& name);
ModelConfig load_model_config(const std::string& path);
// The file a model config reference names: a name ("llama_1b": the shipped configs/models/llama_1b.json,
// from a bundle's share/multinorm/configs or the source tree), or a path (it has a '/' or ends in
// .json), returned as is.
std::string model_config_path(const std::string& name_or_path);
bool is_model_config_name(const std::string& name_or_path);

}  // namespace multinorm
