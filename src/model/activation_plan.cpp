#include "multinorm/activation_plan.h"

#include <algorithm>

#include "multinorm/cuda_scratch.h"
#include "multinorm/error.h"

namespace multinorm {

namespace {
int64_t aligned(int64_t bytes) { return (bytes + 63) / 64 * 64; }
}  // namespace

int64_t ActivationPlan::bytes() const {
  int64_t n = 0;
  for (const auto& b : buffers) n += aligned(b.bytes());
  return n;
}

bool ActivationPlan::has(const std::string& name) const {
  for (const auto& b : buffers)
    if (b.name == name) return true;
  return false;
}

const BufferSpec& ActivationPlan::find(const std::string& name) const {
  for (const auto& b : buffers)
    if (b.name == name) return b;
  throw Error("activation plan: no buffer '" + name + "'");
}

int64_t ActivationPlan::offset_bytes(const std::string& name) const {
  int64_t off = 0;
  for (const auto& b : buffers) {
    if (b.name == name) return off;
    off += aligned(b.bytes());
  }
  throw Error("activation plan: no buffer '" + name + "'");
}
int64_t ActivationPlan::saved_bytes() const {
  int64_t n = 0;
  for (const auto& b : buffers) n += b.saved ? aligned(b.bytes()) : 0;
  return n;
}
int64_t ActivationPlan::scratch_bytes() const { return bytes() - saved_bytes(); }

ActivationPlan plan_activations(const ModelConfig& m, int64_t B, int64_t T, DType act, const ActivationLayout& fused) {
  const int64_t BT = B * T, C = m.hidden_size, F = m.intermediate_size, H = m.num_attention_heads, V = m.vocab_size;
  const DType f32 = DType::F32;
  ActivationPlan p;
  p.micro_batch = B;
  p.seq_len = T;
  auto saved = [&](std::string name, int64_t n, DType t) { p.buffers.push_back({std::move(name), n, t, true}); };
  auto scratch = [&](std::string name, int64_t n, DType t) { p.buffers.push_back({std::move(name), n, t, false}); };
  // An MLP activation [BT, F] or [BT, 2F] (gate_up): rows padded where the backend asks and F's rows
  // are off 16 bytes, the up half then on a 16-byte pack (cuda_scratch::mlp_up_column).
  auto mlp = [&](std::string name, int64_t cols, bool keep) {
    namespace cs = cuda_scratch;
    const int64_t s = dtype_bytes(act);
    const bool pad = fused.pad_mlp_rows && cs::mlp_rows_padded(F, s);
    const int64_t ld = !pad ? 0 : cols == F ? cs::gemm_staged_ld(F, s) : cs::mlp_gate_up_ld(F, s);
    p.buffers.push_back({std::move(name), BT * (ld ? ld : cols), act, keep, ld});
  };
  for (int64_t l = 0; l < m.num_hidden_layers; ++l) {
    const std::string pre = "layers." + std::to_string(l) + ".";
    saved(pre + "input", BT * C, act);
    saved(pre + "ln1", BT * C, act);
    saved(pre + "ln1_rstd", BT, f32);
    saved(pre + "qkv", BT * 3 * C, act);
    saved(pre + "attn_lse", B * H * T, f32);
    saved(pre + "attn_out", BT * C, act);
    saved(pre + "mid", BT * C, act);
    saved(pre + "ln2", BT * C, act);
    saved(pre + "ln2_rstd", BT, f32);
    mlp(pre + "gate_up", 2 * F, true);
  }
  saved("final.input", BT * C, act);
  saved("final.ln", BT * C, act);
  saved("final.rstd", BT, f32);
  const int64_t R = std::min(BT, kHeadChunkRows);
  // With FP32 activations d_logits is the logits buffer itself: it keeps every row.
  saved("logits", fused.loss_head && act != f32 ? fused_logits_elements(R, V) : R * V, f32);
  if (act != f32) saved("d_logits", R * V, act);
  saved("losses", BT, f32);
  scratch("d_resid", BT * C, f32);
  scratch("d_x", BT * C, f32);
  scratch("d_ln", BT * C, act);
  scratch("d_attn_out", BT * C, act);
  scratch("d_qkv", BT * 3 * C, act);
  mlp("swiglu", F, false);
  if (!fused.swiglu_backward) mlp("d_swiglu", F, false);
  mlp("d_gate_up", 2 * F, false);
  return p;
}

}  // namespace multinorm
