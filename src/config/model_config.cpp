// LLaMA model configs in Hugging Face LlamaConfig form.
#include "multinorm/model_config.h"

#include <unistd.h>

#include "multinorm/error.h"
#include "multinorm/install_paths.h"
#include "multinorm/json_file.h"

namespace multinorm {

const Schema& model_schema() {
  using namespace keys;
  using K = ValueKind;
  auto optional_int = [](std::string path, std::string doc) {
    SchemaKey k = integer(std::move(path), nullptr, std::move(doc), 1, 1 << 20);
    k.nullable = true;
    return k;
  };
  static const Schema schema("model", {
      required("vocab_size", K::Integer, "tokens in the vocabulary (embedding and lm_head rows)", 1, 1 << 24),
      required("hidden_size", K::Integer, "model width C", 1, 1 << 20),
      required("intermediate_size", K::Integer, "SwiGLU hidden width F", 1, 1 << 22),
      required("num_hidden_layers", K::Integer, "transformer blocks", 1, 4096),
      required("num_attention_heads", K::Integer, "attention heads; head_dim = hidden_size / heads (even)", 1, 4096),
      positive("rms_norm_eps", 1e-6, "RMSNorm epsilon (added to the FP32 mean square)", 1),
      positive("rope_theta", 10000.0, "RoPE base (rotate-half layout)"),
      integer("max_position_embeddings", 1024, "longest sequence a run may use", 1, 1 << 24),
      positive("initializer_range", 0.02, "std of the N(0, std) init of every linear and the embedding", 10),
      boolean("tie_word_embeddings", false, "share the embedding with lm_head (the paper: false)"),
      // Hugging Face fields, accepted so that a GaLore or HF config.json works as is.
      optional_int("num_key_value_heads", "HF: must equal num_attention_heads (no grouped-query attention)"),
      optional_int("head_dim", "HF: must equal hidden_size / num_attention_heads"),
      choice("hidden_act", "silu", {"silu"}, "HF: activation of the gated MLP (SwiGLU)"),
      choice("model_type", "llama", {"llama"}, "HF: model family"),
      boolean("attention_bias", false, "HF: must be false (LLaMA has no biases)"),
      boolean("mlp_bias", false, "HF: must be false"),
      number("attention_dropout", 0.0, "HF: must be 0", 0, 0),
      integer("pretraining_tp", 1, "HF: must be 1", 1, 1),
      info("rope_scaling", "HF: must be null (plain RoPE)"),
      info("architectures", "HF: informational"),
      info("torch_dtype", "HF: informational (precision comes from the run config)"),
      info("transformers_version", "HF: informational"),
      info("bos_token_id", "HF: informational (token ids come from the tokenizer)"),
      info("eos_token_id", "HF: informational"),
      info("pad_token_id", "HF: informational"),
      info("max_sequence_length", "GaLore: informational"),
      info("use_cache", "HF: informational"),
  });
  return schema;
}

ModelConfig model_config_from_json(const json& doc, const std::string& source, const std::string& name) {
  const json r = model_schema().resolve(doc, source);
  ModelConfig m;
  m.name = name;
  m.source = source;
  m.vocab_size = r["vocab_size"].get<int64_t>();
  m.hidden_size = r["hidden_size"].get<int64_t>();
  m.intermediate_size = r["intermediate_size"].get<int64_t>();
  m.num_hidden_layers = r["num_hidden_layers"].get<int64_t>();
  m.num_attention_heads = r["num_attention_heads"].get<int64_t>();
  m.rms_norm_eps = r["rms_norm_eps"].get<double>();
  m.rope_theta = r["rope_theta"].get<double>();
  m.max_position_embeddings = r["max_position_embeddings"].get<int64_t>();
  m.initializer_range = r["initializer_range"].get<double>();
  m.tie_word_embeddings = r["tie_word_embeddings"].get<bool>();

  auto bad = [&](const std::string& key, const std::string& why) { throw ConfigError(source + ": " + key + ": " + why); };
  if (m.hidden_size % m.num_attention_heads != 0)
    bad("num_attention_heads", "hidden_size " + std::to_string(m.hidden_size) + " is not divisible by " +
                                   std::to_string(m.num_attention_heads) + " heads");
  if (m.head_dim() % 2 != 0) bad("num_attention_heads", "head_dim " + std::to_string(m.head_dim()) + " must be even for RoPE");
  if (!r["num_key_value_heads"].is_null() && r["num_key_value_heads"].get<int64_t>() != m.num_attention_heads)
    bad("num_key_value_heads", "grouped-query attention is not supported: must equal num_attention_heads");
  if (!r["head_dim"].is_null() && r["head_dim"].get<int64_t>() != m.head_dim())
    bad("head_dim", "must equal hidden_size / num_attention_heads = " + std::to_string(m.head_dim()));
  if (r["attention_bias"].get<bool>()) bad("attention_bias", "LLaMA has no biases: must be false");
  if (r["mlp_bias"].get<bool>()) bad("mlp_bias", "LLaMA has no biases: must be false");
  if (!r["rope_scaling"].is_null()) bad("rope_scaling", "RoPE scaling is not supported: must be null");
  return m;
}

static std::string file_stem(const std::string& path) {
  const auto slash = path.find_last_of('/');
  std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  const auto dot = base.rfind('.');
  return dot == std::string::npos ? base : base.substr(0, dot);
}

bool is_model_config_name(const std::string& ref) {
  return !ref.empty() && ref.find('/') == std::string::npos && ref.find(".json") == std::string::npos;
}

std::string model_config_path(const std::string& ref) {
  if (!is_model_config_name(ref)) return ref;
  const std::vector<std::string> dirs = {executable_dir() + "/../share/multinorm/configs/models",
                                         std::string(MULTINORM_SOURCE_DIR) + "/configs/models"};
  for (const std::string& d : dirs)
    if (::access((d + "/" + ref + ".json").c_str(), R_OK) == 0) return d + "/" + ref + ".json";
  throw ConfigError("model " + ref + ": no configs/models/" + ref + ".json in " + dirs[0] + " or " + dirs[1] +
                    " (a name is one of the shipped model configs; a path has a '/' or ends in .json)");
}

ModelConfig load_model_config(const std::string& path) {
  return model_config_from_json(read_json_file(path), path, file_stem(path));
}

json ModelConfig::to_hf_json() const {
  json j;
  j["architectures"] = json::array({"LlamaForCausalLM"});
  j["model_type"] = "llama";
  j["vocab_size"] = vocab_size;
  j["hidden_size"] = hidden_size;
  j["intermediate_size"] = intermediate_size;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_attention_heads"] = num_attention_heads;
  j["num_key_value_heads"] = num_attention_heads;
  j["hidden_act"] = "silu";
  j["max_position_embeddings"] = max_position_embeddings;
  j["rms_norm_eps"] = rms_norm_eps;
  j["rope_theta"] = rope_theta;
  j["initializer_range"] = initializer_range;
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["attention_bias"] = false;
  j["mlp_bias"] = false;
  return j;
}

}  // namespace multinorm
