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

namespace multinorm {

struct LossSum {
  double sum = 0.0;    // sum of per-position losses over counted positions
  int64_t count = 0;   // counted positions
  double mean() const { return count ? sum / static_cast<double>(count) : 0.0; }
};

// Wall time per op kind, for `bench model` (host-side timing: exact on the CPU backend).
enum class Op { Embedding, RmsNorm, Matmul, Rope, Attention, MatmulSwiGLU, LossHead, Copy, kCount };
const char* op_name(Op op);
struct OpProfile {
  std::array<double, static_cast<size_t>(Op::kCount)> seconds{};
  bool enabled = false;
  void reset() { seconds.fill(0.0); }
};

// Told by forward_backward() when a range [begin, end) of the gradient arena (elements) is final for
// the micro-batch, in the order the backward pass finishes them (gradient_ready_order()), and given
// progress() calls between the backward pass's ops: data parallelism starts reducing a layer's
// gradients while the layers below it are still being differentiated.
class GradientListener {
 public:
  virtual ~GradientListener() = default;
  virtual void gradients_ready(int64_t begin, int64_t end) = 0;
  virtual void progress() = 0;
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
  const std::vector<TensorSpec>& tensors() const { return specs_; }
  const TensorSpec& tensor(const std::string& name) const;
  DType dtype() const { return dtype_; }
  DType grad_dtype() const { return grad_dtype_; }
  int64_t num_params() const { return nparams_; }
  Backend& backend() { return be_; }
  Buf params() const { return {params_, dtype_}; }
  Buf grads() const { return {grads_, grad_dtype_}; }
  Buf param(const TensorSpec& t) const { return params().at(t.offset); }
  Buf grad(const TensorSpec& t) const { return grads().at(t.offset); }
  int64_t activation_bytes() const { return plan_.bytes(); }
  const ActivationPlan& activation_plan() const { return plan_; }
  Buf activation(const std::string& name) const { return act(name); }  // a buffer of the plan (tests, tools)

  // N(0, initializer_range) for the embedding and every linear, ones for the norms. Each element is
  // a counter-based draw from (seed, tensor, element): independent of threads and backend.
  void init_random(uint64_t seed);
  // Parameters or gradients as FP32 on the host, in arena order, and back.
  std::vector<float> params_to_host() const;
  std::vector<float> grads_to_host() const;
  void params_from_host(const std::vector<float>& values);
  // A new update starts: the gradient arena and the update's loss totals are zeroed.
  void zero_grads();
  // Bumped by zero_grads() and every backward pass: what the gradient arena holds has changed.
  int64_t gradient_version() const { return grad_version_; }

  // A training micro-batch, queued with no host wait: accumulates into the gradient arena the
  // gradient of grad_scale * (sum of counted per-position losses), and adds its losses to the
  // update's loss totals (backend memory: update_loss_totals(); the optimizer's statistics read them).
  // With graphs on (a backend that has them: CUDA) its ops are one graph per shape and grad_scale
  // (GraphCache); with a gradient listener (data parallelism's last micro-batch) or profiling they run
  // eagerly.
  void queue_forward_backward(const MicroBatch& mb, float grad_scale);
  LossTotals* update_loss_totals() { return loss_totals_; }
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

  // The ranges forward_backward() reports, in its order: the head (final norm, and lm_head when
  // untied), layer L-1, ..., layer 0, the embedding (with the tied lm_head). They tile the arena.
  std::vector<std::pair<int64_t, int64_t>> gradient_ready_order() const;
  void set_gradient_listener(GradientListener* listener) { listener_ = listener; }

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
  DType dtype_, grad_dtype_;
  int64_t max_batch_, max_seq_;
  std::vector<TensorSpec> specs_;
  int64_t nparams_ = 0;
  ActivationPlan plan_;
  void* params_ = nullptr;
  void* grads_ = nullptr;
  void* acts_ = nullptr;
  float* rope_ = nullptr;  // [max_seq, D/2, 2] cos, sin
  int32_t* tokens_ = nullptr;
  int32_t* targets_ = nullptr;
  uint8_t* mask_ = nullptr;
  LossTotals* loss_totals_ = nullptr;  // backend memory: [the update's, one forward()/forward_backward()'s]
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
  GradientListener* listener_ = nullptr;
  double last_forward_s_ = 0, last_backward_s_ = 0;
};

}  // namespace multinorm
