#include "multinorm/model_spec.h"

#include <algorithm>

#include "multinorm/cuda_scratch.h"

namespace multinorm {

TensorGroup TensorSpec::group() const {
  switch (role) {
    case TensorRole::Embedding: return TensorGroup::Embedding;
    case TensorRole::AttnQ:
    case TensorRole::AttnK:
    case TensorRole::AttnV:
    case TensorRole::AttnO: return TensorGroup::Attention;
    case TensorRole::MlpGate:
    case TensorRole::MlpUp:
    case TensorRole::MlpDown: return TensorGroup::Mlp;
    case TensorRole::InputNorm:
    case TensorRole::PostAttnNorm:
    case TensorRole::FinalNorm: return TensorGroup::Norm;
    case TensorRole::LmHead: return TensorGroup::LmHead;
  }
  return TensorGroup::Norm;
}

const char* group_name(TensorGroup g) {
  switch (g) {
    case TensorGroup::Embedding: return "embedding";
    case TensorGroup::Attention: return "attention (q,k,v,o)";
    case TensorGroup::Mlp: return "mlp (gate,up,down)";
    case TensorGroup::Norm: return "norms";
    case TensorGroup::LmHead: return "lm_head";
  }
  return "?";
}

std::vector<TensorSpec> llama_parameters(const ModelConfig& m) {
  const int64_t V = m.vocab_size, C = m.hidden_size, F = m.intermediate_size;
  std::vector<TensorSpec> t;
  t.push_back({"model.embed_tokens.weight", TensorRole::Embedding, -1, {V, C}});
  for (int l = 0; l < static_cast<int>(m.num_hidden_layers); ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    t.push_back({p + "self_attn.q_proj.weight", TensorRole::AttnQ, l, {C, C}});
    t.push_back({p + "self_attn.k_proj.weight", TensorRole::AttnK, l, {C, C}});
    t.push_back({p + "self_attn.v_proj.weight", TensorRole::AttnV, l, {C, C}});
    t.push_back({p + "self_attn.o_proj.weight", TensorRole::AttnO, l, {C, C}});
    t.push_back({p + "mlp.gate_proj.weight", TensorRole::MlpGate, l, {F, C}});
    t.push_back({p + "mlp.up_proj.weight", TensorRole::MlpUp, l, {F, C}});
    t.push_back({p + "mlp.down_proj.weight", TensorRole::MlpDown, l, {C, F}});
    t.push_back({p + "input_layernorm.weight", TensorRole::InputNorm, l, {C}});
    t.push_back({p + "post_attention_layernorm.weight", TensorRole::PostAttnNorm, l, {C}});
  }
  t.push_back({"model.norm.weight", TensorRole::FinalNorm, -1, {C}});
  if (!m.tie_word_embeddings) t.push_back({"lm_head.weight", TensorRole::LmHead, -1, {V, C}});
  int64_t offset = 0;
  for (auto& s : t) {
    s.offset = s.arena_offset = offset;
    offset += s.numel();
  }
  return t;
}

int64_t count_parameters(const std::vector<TensorSpec>& specs) {
  int64_t n = 0;
  for (const auto& s : specs) n += s.numel();
  return n;
}

int64_t layout_arena(std::vector<TensorSpec>& specs, bool pad_mlp_rows, int64_t param_bytes, int64_t grad_bytes) {
  namespace cs = cuda_scratch;
  int64_t at = 0;
  for (auto& s : specs) {
    s.arena_ld = 0, s.arena_rows = 0;
    const int64_t F = s.cols();
    const bool off = cs::mlp_rows_padded(F, param_bytes) || cs::mlp_rows_padded(F, grad_bytes);
    if (pad_mlp_rows && s.role == TensorRole::MlpDown && off && at * param_bytes % 16 == 0 && at * grad_bytes % 16 == 0)
      s.arena_ld = std::max(cs::gemm_staged_ld(F, param_bytes), cs::gemm_staged_ld(F, grad_bytes));
    // The gate and up projections' F rows, each followed by zero rows up to the column where the
    // plan's padded gate/up activation starts its up half (cuda_scratch::mlp_up_column, by the
    // activations' dtype, the weights'): every GEMM of each half then spans whole packs.
    const bool gate_or_up = s.role == TensorRole::MlpGate || s.role == TensorRole::MlpUp;
    if (pad_mlp_rows && gate_or_up && cs::mlp_rows_padded(s.rows(), param_bytes)) s.arena_rows = cs::mlp_up_column(s.rows(), 1, param_bytes);
    s.arena_offset = at;
    at += s.arena_numel();
  }
  return at;
}

int64_t arena_elements(const std::vector<TensorSpec>& specs) {
  int64_t end = 0;
  for (const auto& s : specs) end = std::max(end, s.arena_offset + s.arena_numel());
  return end;
}

bool glob_match(const std::string& pattern, const std::string& name) {
  // Iterative wildcard match with backtracking to the last '*'.
  size_t p = 0, n = 0, star = std::string::npos, mark = 0;
  while (n < name.size()) {
    if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      mark = n;
    } else if (p < pattern.size() && pattern[p] == name[n]) {
      ++p, ++n;
    } else if (star != std::string::npos) {
      p = star + 1;
      n = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

}  // namespace multinorm
