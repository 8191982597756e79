#include "multinorm/model_io.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "multinorm/error.h"
#include "multinorm/json_file.h"
#include "multinorm/safetensors.h"

namespace multinorm {

void save_hf_model(const ParamStore& params, const ModelConfig& config, const std::string& dir, DType dtype) {
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) throw Error(dir + ": cannot create: " + std::strerror(errno));
  const std::vector<float> values = params.params_to_host();
  std::vector<TensorData> tensors;
  for (const auto& t : params.tensors()) tensors.push_back(from_f32_vector(t.name, t.shape, values.data() + t.offset, dtype));
  write_safetensors(dir + "/model.safetensors", tensors, {{"format", "pt"}, {"producer", "multinorm " MULTINORM_VERSION}});
  json cfg = config.to_hf_json();
  cfg["torch_dtype"] = dtype == DType::BF16 ? "bfloat16" : "float32";
  write_text_file_atomic(dir + "/config.json", cfg.dump(2) + "\n");
}

void load_hf_model(ParamStore& params, const ModelConfig& config, const std::string& dir) {
  const std::string cfg_path = dir + "/config.json";
  const ModelConfig theirs = model_config_from_json(read_json_file(cfg_path), cfg_path, "init_from");
  const ModelConfig& ours = config;
  auto same = [&](const char* field, int64_t a, int64_t b) {
    if (a != b)
      throw ConfigError(cfg_path + ": " + field + " is " + std::to_string(a) + ", the run's model has " + std::to_string(b));
  };
  same("vocab_size", theirs.vocab_size, ours.vocab_size);
  same("hidden_size", theirs.hidden_size, ours.hidden_size);
  same("intermediate_size", theirs.intermediate_size, ours.intermediate_size);
  same("num_hidden_layers", theirs.num_hidden_layers, ours.num_hidden_layers);
  same("num_attention_heads", theirs.num_attention_heads, ours.num_attention_heads);
  same("tie_word_embeddings", theirs.tie_word_embeddings, ours.tie_word_embeddings);
  const SafetensorsFile file(dir + "/model.safetensors");
  std::vector<float> values(params.num_params());
  for (const auto& t : params.tensors()) {
    if (!file.contains(t.name)) throw Error(file.path() + ": missing tensor '" + t.name + "'");
    const TensorData& d = file.get(t.name);
    if (d.shape != t.shape) {
      std::string got, want;
      for (auto x : d.shape) got += (got.empty() ? "" : "x") + std::to_string(x);
      for (auto x : t.shape) want += (want.empty() ? "" : "x") + std::to_string(x);
      throw Error(file.path() + ": tensor '" + t.name + "' has shape " + got + ", expected " + want);
    }
    const std::vector<float> v = to_f32_vector(d);
    std::copy(v.begin(), v.end(), values.begin() + t.offset);
  }
  params.params_from_host(values);
}

}  // namespace multinorm
