// Model weights in Hugging Face form: a directory with model.safetensors (HF tensor names) and
// config.json (LlamaConfig), which transformers' LlamaForCausalLM loads, and which `model.init_from`
// starts a run from.
#pragma once
#include <string>

#include "multinorm/model_config.h"
#include "multinorm/param_store.h"

namespace multinorm {

// The weights of `params`, a model of architecture `config`, in `dtype`.
void save_hf_model(const ParamStore& params, const ModelConfig& config, const std::string& dir, DType dtype);
// Loads weights into `params`, a model of architecture `config`; the directory's config.json must
// describe the same architecture and every tensor must be present with its shape. Errors name the
// file and the tensor or field.
void load_hf_model(ParamStore& params, const ModelConfig& config, const std::string& dir);

}  // namespace multinorm
