// The activation arena of one micro-batch: every buffer the forward pass saves for the backward
// pass, and the scratch the backward pass reuses layer after layer. The model allocates exactly this
// plan once; `multinorm info` sums it, so the estimate is the allocation.
//
// Shapes (BT = micro_batch * seq_len, C = hidden, F = intermediate, H = heads, V = vocab):
//   per layer l, saved:   input [BT,C]  ln1 [BT,C]  ln1_rstd [BT] f32  qkv [BT,3C] (q,k after RoPE)
//                         attn_lse [B,H,T] f32  attn_out [BT,C]  mid [BT,C]  ln2 [BT,C]
//                         ln2_rstd [BT] f32  gate_up [BT,2F]
//   final, saved:         final.input [BT,C]  final.ln [BT,C]  final.rstd [BT] f32
//   loss head, in chunks of R = min(BT, kHeadChunkRows) rows (logits are never materialised for the
//   whole micro-batch):   logits [R,V] f32  d_logits [R,V] (bf16 only; fp32 overwrites logits)
//                         losses [BT] f32
//   backward scratch:     d_resid [BT,C] f32  d_x [BT,C] f32  d_ln [BT,C]  d_attn_out [BT,C]
//                         d_qkv [BT,3C]  swiglu [BT,F]  d_swiglu [BT,F]  d_gate_up [BT,2F]
// "act" buffers are stored in the parameter dtype (bf16 or fp32). gate_up, swiglu, d_swiglu and
// d_gate_up have rows padded to 128 bytes where the backend asks (ActivationLayout::pad_mlp_rows)
// and F's rows are off 16 bytes; gate_up's and d_gate_up's up half then starts on a 16-byte pack
// (cuda_scratch::mlp_up_column).
//
// A backend whose fused kernels never touch a buffer says so (Backend::activation_layout) and the
// plan leaves it out: with the loss head fused, logits keeps min(R, kFusedLogitsRows) rows, for the
// logits a caller asks for (generation, tests), which the model computes that many rows at a time; with
// SwiGLU's backward fused, there is no d_swiglu. (llama_60m at 8 x 256 in BF16: 117 + 5.4 MiB less.)
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "multinorm/dtype.h"
#include "multinorm/model_config.h"

namespace multinorm {

// Rows of the logits computed at once by the loss head.
constexpr int64_t kHeadChunkRows = 1024;
// Rows of the FP32 logits buffer when the backend fuses the loss head (only host logits use it).
constexpr int64_t kFusedLogitsRows = 64;
// The fused plan's FP32 logits buffer for R rows of V logits: kFusedLogitsRows rows, and at least
// an 8-column chunk of every row (a vocabulary under R / 8).
inline int64_t fused_logits_elements(int64_t R, int64_t V) {
  const int64_t rows = R < kFusedLogitsRows ? R : kFusedLogitsRows;
  return rows * V > 8 * R ? rows * V : 8 * R;
}

// The columns of one vocabulary chunk of a fused loss head that computes R rows' FP32 logits a chunk
// at a time into that buffer (as [R, Vc]): all of V when R fits the buffer's rows, else the most that
// fit, a multiple of 8 (16-byte packs), at least 8.
inline int64_t fused_logits_vocab_chunk(int64_t R, int64_t V) {
  if (R <= kFusedLogitsRows) return V;
  const int64_t fit = fused_logits_elements(R, V) / R / 8 * 8;
  return fit < 8 ? 8 : fit;
}

// The CUDA backend's fused loss head (and the cost model's record of it): whether it takes these
// operands (BF16 x, w and, when given, dlogits; otherwise the GEMM and cross_entropy run), and its
// vocabulary chunks for R rows: `width` columns each, `count` of them.
inline bool cuda_fuses_loss_head(DType x, DType w, bool has_dlogits, DType dlogits) {
  return x == DType::BF16 && w == DType::BF16 && (!has_dlogits || dlogits == DType::BF16);
}
struct VocabChunks {
  int64_t width, count;
};
inline VocabChunks fused_loss_head_chunks(int64_t R, int64_t V) {
  const int64_t width = fused_logits_vocab_chunk(R, V);
  return {width, (V + width - 1) / width};
}

// What a backend wants of the plan: the scratch its fused kernels never write (see above), and
// whether the MLP's activations (gate_up, swiglu and their gradients) get rows padded where F's rows
// are off 16 bytes (cuda_scratch::gemm_staged_ld: 128-byte rows; gate_up's up half on a pack:
// cuda_scratch::mlp_up_column), so its GEMMs take them as they are instead of staging them (an MLP
// width of 5461).
struct ActivationLayout {
  bool loss_head = false;        // linear_cross_entropy never stores `logits`
  bool swiglu_backward = false;  // matmul_swiglu_backward never stores `ds`
  bool pad_mlp_rows = false;
};
// The CUDA backend's (the memory estimate asks it without loading the plugin): the loss head fused
// in BF16 (kernels/cuda/cross_entropy.cu), SwiGLU's backward not, the MLP's rows padded.
inline ActivationLayout cuda_activation_layout(DType act) { return {act == DType::BF16, false, true}; }

struct BufferSpec {
  std::string name;
  int64_t elements;
  DType dtype;
  bool saved;      // kept from forward to backward (else backward scratch)
  int64_t ld = 0;  // a matrix with padded rows: its row stride in elements (Buf::ld); 0: dense
  int64_t bytes() const { return elements * dtype_bytes(dtype); }
};

struct ActivationPlan {
  int64_t micro_batch = 0, seq_len = 0;
  std::vector<BufferSpec> buffers;
  const BufferSpec& find(const std::string& name) const;
  bool has(const std::string& name) const;
  int64_t offset_bytes(const std::string& name) const;  // in one arena, each buffer 64-byte aligned
  int64_t bytes() const;
  int64_t saved_bytes() const;
  int64_t scratch_bytes() const;
};

ActivationPlan plan_activations(const ModelConfig& m, int64_t micro_batch, int64_t seq_len, DType act_dtype,
                                const ActivationLayout& fused = {});

}  // namespace multinorm
