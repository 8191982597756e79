// Model weights in Hugging Face form: a directory with model.safetensors (HF tensor names) and
// config.json (LlamaConfig), which transformers' LlamaForCausalLM loads, and which `model.init_from`
// starts a run from.
#pragma once
#include <string>

#include "multinorm/llama_model.h"

namespace multinorm {

void save_hf_model(const LlamaModel& model, const std::string& dir, DType dtype);
// Loads weights into `model`; the directory's config.json must describe the same architecture and
// every tensor must be present with its shape. Errors name the file and the tensor or field.
void load_hf_model(LlamaModel& model, const std::string& dir);

}  // namespace multinorm
