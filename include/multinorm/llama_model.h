// The LLaMA model, written out by hand: forward and backward of every layer side by side in
// src/model/llama_model.cpp, on any Backend. One parameter arena and one gradient arena (offsets
// from llama_parameters), one activation arena (plan_activations): all allocated at construction,
// nothing inside a step.
#pragma once
#include <array>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "multinorm/activation_plan.h"
#include "multinorm/batch.h"
#include "multinorm/backend.h"
#include "multinorm/graph_cache.h"
#include "multinorm/linear.h"
#include "multinorm/model_config.h"
#include "multinorm/model_spec.h"
#include "multinorm/param_store.h"

namespace multinorm {

struct LossSum {
  double sum = 0.0;    // sum of per-position losses over counted positions
  int64_t count = 0;   // counted positions
  double mean() const { return count ? sum / static_cast<double>(count) : 0.0; }
};

// Wall time per op kind, for `bench model` (host-side timing: exact on the CPU backend).
enum class Op { Embedding, RmsNorm, Matmul, Rope, Attention, MatmulSwiGLU, LossHead, kCount };
const char* op_name(Op op);
struct OpProfile {
  std::array<double, static_cast<size_t>(Op::kCount)> seconds{};
  bool enabled = false;
  void reset() { seconds.fill(0.0); }
};

// The GEMMs of one training step (forward and backward of one micro-batch of BT rows), as
// LlamaModel's projections (linear.h) issue them: out[M,N] (+)= op(a)[M,K] op(b)[K,N], `count` times
// per step. The bench measures the GEMM engine on them and the CPU memory estimate sizes the AMX
// packing buffers from them. row_strips: a fused epilogue takes the output's rows where the backend
// fuses it (SwiGLU, the loss head: packed_matmul_row_strips on the CPU).
std::vector<GemmShape> training_step_gemms(const ModelConfig& m, int64_t BT);

class LlamaModel {
 public:
  // `dtype` stores weights and activations; `grad_dtype` the gradient arena: the same (the paper:
  // BF16, every accumulated partial sum rounded) or FP32 with BF16 weights (llm.c, torchtitan).
  LlamaModel(Backend& backend, const ModelConfig& config, DType dtype, int64_t max_batch, int64_t max_seq,
             DType grad_dtype);
  LlamaModel(Backend& backend, const ModelConfig& config, DType dtype, int64_t max_batch, int64_t max_seq)
      : LlamaModel(backend, config, dtype, max_batch, max_seq, dtype) {}
  ~LlamaModel();
  LlamaModel(const LlamaModel&) = delete;
  LlamaModel& operator=(const LlamaModel&) = delete;

  const ModelConfig& config() const { return cfg_; }
  // The parameters, their gradients and the update's loss totals: what the optimizer, gradient sync
  // and checkpoints take. The accessors below are the store's, for the model's own callers.
  ParamStore& store() { return store_; }
  const ParamStore& store() const { return store_; }
  const std::vector<TensorSpec>& tensors() const { return store_.tensors(); }
  const TensorSpec& tensor(const std::string& name) const { return store_.tensor(name); }
  DType dtype() const { return store_.dtype(); }
  DType grad_dtype() const { return store_.grad_dtype(); }
  int64_t num_params() const { return store_.num_params(); }
  Backend& backend() { return be_; }
  Buf params() const { return store_.params(); }
  Buf grads() const { return store_.grads(); }
  Buf param(const TensorSpec& t) const { return store_.param(t); }
  Buf grad(const TensorSpec& t) const { return store_.grad(t); }
  int64_t activation_bytes() const { return plan_.bytes(); }
  const ActivationPlan& activation_plan() const { return plan_; }
  Buf activation(const std::string& name) const { return act(name); }  // a buffer of the plan (tests, tools)

  // N(0, initializer_range) for the embedding and every linear, ones for the norms. Each element is
  // a counter-based draw from (seed, tensor, element): independent of threads and backend.
  void init_random(uint64_t seed);
  // Parameters or gradients as FP32 on the host, in arena order, and back.
  std::vector<float> params_to_host() const { return store_.params_to_host(); }
  std::vector<float> grads_to_host() const { return store_.grads_to_host(); }
  void params_from_host(const std::vector<float>& values) { store_.params_from_host(values); }
  // A new update starts: the gradient arena and the update's loss totals are zeroed.
  void zero_grads();
  // Bumped by zero_grads() and every backward pass: what the gradient arena holds has changed.
  int64_t gradient_version() const { return grad_version_; }

  // A training micro-batch, queued with no host wait: accumulates into the gradient arena the
  // gradient of grad_scale * (sum of counted per-position losses), and adds its losses to the
  // update's loss totals (ParamStore::update_loss_totals(); the optimizer's statistics read them).
  // With graphs on (a backend that has them: CUDA) its ops are one graph per shape and grad_scale
  // (GraphCache); with a gradient listener (data parallelism's last micro-batch) or profiling they run
  // eagerly.
  void queue_forward_backward(const MicroBatch& mb, float grad_scale);
  // Mean-free loss sums, read back (a host wait): forward() only evaluates; forward_backward() is
  // queue_forward_backward() and this micro-batch's loss.
  LossSum forward(const MicroBatch& mb);
  LossSum forward_backward(const MicroBatch& mb, float grad_scale);
  void set_graphs(bool on) { graphs_.set_enabled(on); }
  const GraphCache& graphs() const { return graphs_; }
  // Logits of every position, [B*T, V] FP32 on the host (sampling, cross-checks).
  void logits(const MicroBatch& mb, float* host_logits);

  // Incremental decoding with a key/value cache (batch 1), for sampling: start_decoding() allocates
  // the cache (2 x layers x max_seq x hidden, in the model dtype) once; each decode_step() runs one
  // token at the next position through every layer against the cache and copies its logits [V]
  // (FP32) to the host: O(position) attention work and one row of every GEMM per token, instead of
  // recomputing the whole context. decode_position() is the number of positions cached.
  void start_decoding();
  void decode_step(int32_t token, float* host_logits);
  int64_t decode_position() const { return decode_pos_; }
  int64_t max_seq() const { return max_seq_; }

  OpProfile& profile() { return profile_; }
  // Wall time of the forward and backward passes of the last forward_backward() call.
  double last_forward_seconds() const { return last_forward_s_; }
  double last_backward_seconds() const { return last_backward_s_; }

 private:
  // A layer's projections (qkv = [q; k; v] rows, gate_up = [gate; up]) and its norms' weights and
  // gradients.
  struct Layer {
    Linear qkv, o, gate_up, down;
    Buf input_norm, post_norm, d_input_norm, d_post_norm;
  };
  struct LayerActs {
    Buf input, ln1, qkv, attn_out, mid, ln2, gate_up;
    float *ln1_rstd, *lse, *ln2_rstd;
  };
  void upload(const MicroBatch& mb, bool need_targets);
  void forward_layers(int64_t B, int64_t T);
  void head(int64_t BT, bool backward, float grad_scale, float* host_logits);
  LossSum loss_of_this_call(int64_t BT);
  void backward_layers(int64_t B, int64_t T);
  Buf act(const std::string& name) const;
  float* act_f32(const std::string& name) const { return act(name).f32(); }

  struct Timer;
  Timer time(Op op);

  Backend& be_;
  ModelConfig cfg_;
  int64_t max_batch_, max_seq_;
  ParamStore store_;
  ActivationPlan plan_;
  void* acts_ = nullptr;
  float* rope_ = nullptr;  // [max_seq, D/2, 2] cos, sin
  int32_t* tokens_ = nullptr;
  int32_t* targets_ = nullptr;
  uint8_t* mask_ = nullptr;
  LossTotals* call_loss_ = nullptr;  // backend memory: one forward()/forward_backward() call's loss totals
  std::vector<uint8_t> all_counted_;   // the mask of a micro-batch without one
  int64_t grad_version_ = 0;
  GraphCache graphs_{be_.queue()};
  void forward_backward_ops(int64_t B, int64_t T, float grad_scale);
  std::vector<Layer> layers_;
  std::vector<LayerActs> a_;
  Buf wte_, dwte_, wnorm_, dwnorm_;
  Linear lm_head_;  // [V, C]: the embedding's rows when tied
  void* kv_cache_ = nullptr;  // [layers][k | v][max_seq, C]
  int64_t decode_pos_ = 0;
  OpProfile profile_;
  double last_forward_s_ = 0, last_backward_s_ = 0;
};

}  // namespace multinorm
