// The parameter table of a LLaMA model: every tensor with its Hugging Face name, shape and role, in
// the order of the parameter arena. One table serves the param/grad arenas, the optimizer's
// parameter groups, checkpoints, safetensors export and `multinorm info`.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "multinorm/model_config.h"

namespace multinorm {

enum class TensorRole {
  Embedding,     // model.embed_tokens.weight        [V, C]
  AttnQ,         // model.layers.L.self_attn.q_proj  [C, C]   (HF layout: [out, in])
  AttnK,         //                       k_proj     [C, C]
  AttnV,         //                       v_proj     [C, C]
  AttnO,         //                       o_proj     [C, C]
  MlpGate,       // model.layers.L.mlp.gate_proj     [F, C]
  MlpUp,         //                    up_proj       [F, C]
  MlpDown,       //                    down_proj     [C, F]
  InputNorm,     // model.layers.L.input_layernorm.weight           [C]
  PostAttnNorm,  // model.layers.L.post_attention_layernorm.weight  [C]
  FinalNorm,     // model.norm.weight                [C]
  LmHead,        // lm_head.weight                   [V, C]  (absent when tied)
};

enum class TensorGroup { Embedding, Attention, Mlp, Norm, LmHead };

struct TensorSpec {
  std::string name;
  TensorRole role;
  int layer;  // -1 outside the blocks
  std::vector<int64_t> shape;
  int64_t offset = 0;  // elements from the start of the parameter arena

  int64_t numel() const {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
  int64_t rows() const { return shape[0]; }
  int64_t cols() const { return shape.size() > 1 ? shape[1] : 1; }
  TensorGroup group() const;
};

const char* group_name(TensorGroup g);

std::vector<TensorSpec> llama_parameters(const ModelConfig& m);
int64_t count_parameters(const std::vector<TensorSpec>& specs);

// '*' matches any run of characters (dots included); everything else matches itself.
bool glob_match(const std::string& pattern, const std::string& name);

}  // namespace multinorm
