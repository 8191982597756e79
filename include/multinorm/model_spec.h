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
  int64_t offset = 0;  // elements before it in the parameters' logical order (host vectors, checkpoints)
  // Where it lives in the backend's arenas (ParamStore: weights and gradients alike): its first
  // element, its rows' stride where they are padded (0: dense rows), and its rows where zero rows
  // follow them (0: none; the CUDA plan's gate and up projections, F rounded up to a 16-byte pack, so
  // each half of the gate/up GEMMs runs over whole packs: Linear::halves). layout_arena sets them; a
  // backend that pads nothing has arena_offset == offset.
  int64_t arena_offset = 0, arena_ld = 0, arena_rows = 0;

  int64_t numel() const {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
  int64_t rows() const { return shape[0]; }
  int64_t cols() const { return shape.size() > 1 ? shape[1] : 1; }
  int64_t row_stride() const { return arena_ld ? arena_ld : cols(); }
  int64_t arena_numel() const { return arena_ld || arena_rows ? (arena_rows ? arena_rows : rows()) * row_stride() : numel(); }
  TensorGroup group() const;
};

const char* group_name(TensorGroup g);

std::vector<TensorSpec> llama_parameters(const ModelConfig& m);
int64_t count_parameters(const std::vector<TensorSpec>& specs);
// The tensors laid out in the backend's arenas, in table order. With pad_mlp_rows (the backend's
// ActivationLayout: the CUDA backend's) a matrix whose rows are the MLP's width (the down projection,
// [C, F]) gets rows of 128 bytes where F's are off 16 bytes in the weights' or the gradients' dtype
// (llama_1b's 5461 BF16: 5504), as the MLP's activations do, so its GEMMs take it as it is: no copy
// a micro-batch (cuda_scratch::gemm_staging). Only where its arena offset is on 16 bytes in both
// dtypes (every LLaMA with C a multiple of 8): the arena has no gaps. The padding holds zeros (an
// arena is zero-filled; ops write a row's columns only). Returns the arena's length in elements.
int64_t layout_arena(std::vector<TensorSpec>& specs, bool pad_mlp_rows, int64_t param_bytes, int64_t grad_bytes);
// The arena's length in elements (the end of its last tensor).
int64_t arena_elements(const std::vector<TensorSpec>& specs);

// '*' matches any run of characters (dots included); everything else matches itself.
bool glob_match(const std::string& pattern, const std::string& name);

}  // namespace multinorm
