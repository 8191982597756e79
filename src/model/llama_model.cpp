// LLaMA forward and backward, written out layer by layer (no autograd).
//
// Shapes: B sequences, T positions, BT = B*T rows; C = hidden, F = intermediate, H heads of D = C/H,
// V = vocab. Weights in Hugging Face layout [out, in]; every projection y = x W^T is a Linear
// (linear.h: its forward, input-gradient and weight-gradient GEMMs). The arena keeps q, k, v (and
// gate, up) adjacent, so each group is one [3C, C] (or [2F, C]) projection.
//
// Block l (pre-norm):   ln1 = rmsnorm(x)               qkv = ln1 Wqkv^T, RoPE on q and k
//                       attn = causal_softmax_attention(qkv)
//                       mid = x + attn Wo^T            ln2 = rmsnorm(mid)
//                       gate_up = ln2 Wgu^T            out = mid + swiglu(gate_up) Wdown^T
// Head:                 lnf = rmsnorm(x_L)             logits = lnf Wlm^T (chunks of rows)
//                       loss = cross_entropy(logits, targets, mask)
#include "multinorm/llama_model.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "multinorm/error.h"

namespace multinorm {

const char* op_name(Op op) {
  static const char* names[] = {"embedding", "rmsnorm", "matmul", "rope", "attention", "matmul_swiglu", "loss_head"};
  return names[static_cast<size_t>(op)];
}

int64_t MicroBatch::count_targets() const {
  if (!loss_mask) return B * T;
  int64_t n = 0;
  for (int64_t i = 0; i < B * T; ++i) n += loss_mask[i] != 0;
  return n;
}

// Per-op wall time when profiling (bench model): a device backend is drained before and after the
// op so its asynchronous launches are charged to it (profiling only: never on a normal step).
struct LlamaModel::Timer {
  OpProfile* profile;
  Backend* be;
  Op op;
  std::chrono::steady_clock::time_point start;
  ~Timer() {
    if (!profile) return;
    be->queue().wait_all();
    profile->seconds[static_cast<size_t>(op)] += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
};

LlamaModel::Timer LlamaModel::time(Op op) {
  if (profile_.enabled) be_.queue().wait_all();
  return Timer{profile_.enabled ? &profile_ : nullptr, &be_, op, std::chrono::steady_clock::now()};
}

// ---------------------------------------------------------------------------------------------
// Construction: the three arenas and their named views
// ---------------------------------------------------------------------------------------------

namespace {
// The gradient arena's ranges in the order the backward pass finishes them: the head (final norm,
// and lm_head when untied), layer L-1, ..., layer 0, the embedding (with the tied lm_head).
ArenaRanges llama_gradient_ready_order(const ModelConfig& cfg, const std::vector<TensorSpec>& specs) {
  auto offset = [&](const std::string& name) {
    for (const auto& t : specs)
      if (t.name == name) return t.arena_offset;
    throw Error("model: no tensor named '" + name + "'");
  };
  const int64_t head_begin = offset("model.norm.weight");
  ArenaRanges order = {{head_begin, arena_elements(specs)}};
  for (int64_t l = cfg.num_hidden_layers; l-- > 0;) {
    const int64_t begin = offset("model.layers." + std::to_string(l) + ".self_attn.q_proj.weight");
    const int64_t end = l + 1 < cfg.num_hidden_layers ? offset("model.layers." + std::to_string(l + 1) + ".self_attn.q_proj.weight")
                                                      : head_begin;
    order.push_back({begin, end});
  }
  order.push_back({0, offset("model.layers.0.self_attn.q_proj.weight")});  // the embedding (and the tied lm_head)
  return order;
}
// The tensor table laid out in the backend's arenas (layout_arena: the CUDA backend pads the down
// projection's rows where F's are off 16 bytes).
std::vector<TensorSpec> llama_arena(const ModelConfig& cfg, Backend& be, DType dtype, DType grad_dtype) {
  std::vector<TensorSpec> specs = llama_parameters(cfg);
  layout_arena(specs, be.activation_layout(dtype).pad_mlp_rows, dtype_bytes(dtype), dtype_bytes(grad_dtype));
  return specs;
}
}  // namespace

LlamaModel::LlamaModel(Backend& backend, const ModelConfig& config, DType dtype, int64_t max_batch, int64_t max_seq,
                       DType grad_dtype)
    : be_(backend), cfg_(config), max_batch_(max_batch), max_seq_(max_seq),
      store_(backend, llama_arena(config, backend, dtype, grad_dtype), dtype, grad_dtype,
             llama_gradient_ready_order(config, llama_arena(config, backend, dtype, grad_dtype))) {
  if (max_seq > cfg_.max_position_embeddings)
    throw Error("model: sequence length " + std::to_string(max_seq) + " exceeds max_position_embeddings " +
                std::to_string(cfg_.max_position_embeddings));
  plan_ = plan_activations(cfg_, max_batch, max_seq, dtype, be_.activation_layout(dtype));
  acts_ = be_.allocate(plan_.bytes());
  const int64_t BT = max_batch * max_seq, D = cfg_.head_dim();
  tokens_ = static_cast<int32_t*>(be_.allocate(BT * 4));
  targets_ = static_cast<int32_t*>(be_.allocate(BT * 4));
  mask_ = static_cast<uint8_t*>(be_.allocate(BT));
  call_loss_ = static_cast<LossTotals*>(be_.allocate(sizeof(LossTotals)));
  all_counted_.assign(static_cast<size_t>(BT), 1);

  // RoPE table, computed as Hugging Face does (FP32 inverse frequencies, FP32 angle).
  std::vector<float> cs(max_seq * D);
  for (int64_t p = 0; p < max_seq; ++p)
    for (int64_t i = 0; i < D / 2; ++i) {
      const float inv = 1.0f / std::pow(static_cast<float>(cfg_.rope_theta), static_cast<float>(2 * i) / static_cast<float>(D));
      const float angle = static_cast<float>(p) * inv;
      cs[(p * (D / 2) + i) * 2] = static_cast<float>(std::cos(static_cast<double>(angle)));
      cs[(p * (D / 2) + i) * 2 + 1] = static_cast<float>(std::sin(static_cast<double>(angle)));
    }
  rope_ = static_cast<float*>(be_.allocate(cs.size() * 4));
  be_.to_device(rope_, cs.data(), cs.size() * 4);

  auto view = [&](const std::string& name, bool grad) { const auto& t = tensor(name); return grad ? this->grad(t) : param(t); };
  auto linear = [&](const std::string& name, int64_t in, int64_t out) { return Linear{view(name, false), view(name, true), in, out}; };
  // W = [gate; up]: the up tensor follows the gate's rows (and their zero rows, TensorSpec::arena_rows).
  auto gate_up = [&](const std::string& gate, const std::string& up, int64_t in, int64_t out) {
    const int64_t up_row = (tensor(up).arena_offset - tensor(gate).arena_offset) / in;
    return Linear{view(gate, false), view(gate, true), in, out, true, up_row};
  };
  const int64_t C = cfg_.hidden_size, F = cfg_.intermediate_size;
  for (int64_t l = 0; l < cfg_.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    layers_.push_back({linear(p + "self_attn.q_proj.weight", C, 3 * C), linear(p + "self_attn.o_proj.weight", C, C),
                       gate_up(p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight", C, 2 * F), linear(p + "mlp.down_proj.weight", F, C),
                       view(p + "input_layernorm.weight", false), view(p + "post_attention_layernorm.weight", false),
                       view(p + "input_layernorm.weight", true), view(p + "post_attention_layernorm.weight", true)});
  }
  wte_ = view("model.embed_tokens.weight", false);
  dwte_ = view("model.embed_tokens.weight", true);
  wnorm_ = view("model.norm.weight", false);
  dwnorm_ = view("model.norm.weight", true);
  lm_head_ = linear(cfg_.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight", C, cfg_.vocab_size);
  for (int64_t l = 0; l < cfg_.num_hidden_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    a_.push_back({act(p + "input"), act(p + "ln1"), act(p + "qkv"), act(p + "attn_out"), act(p + "mid"), act(p + "ln2"),
                  act(p + "gate_up"), act_f32(p + "ln1_rstd"), act_f32(p + "attn_lse"), act_f32(p + "ln2_rstd")});
  }
}

LlamaModel::~LlamaModel() {
  if (kv_cache_) be_.release(kv_cache_);
  for (void* p : {acts_, static_cast<void*>(rope_), static_cast<void*>(tokens_), static_cast<void*>(targets_),
                  static_cast<void*>(mask_), static_cast<void*>(call_loss_)})
    be_.release(p);
}

Buf LlamaModel::act(const std::string& name) const {
  const BufferSpec& b = plan_.find(name);
  return {static_cast<char*>(acts_) + plan_.offset_bytes(name), b.dtype, b.ld};
}

// ---------------------------------------------------------------------------------------------
// Parameters
// ---------------------------------------------------------------------------------------------

namespace {
// splitmix64: a counter-based generator, so element e of tensor t gets the same draw whatever the
// thread layout.
inline uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
inline double uniform01(uint64_t bits) { return (static_cast<double>(bits >> 11) + 0.5) * (1.0 / 9007199254740992.0); }
}  // namespace

void LlamaModel::init_random(uint64_t seed) {
  const std::vector<TensorSpec>& specs = tensors();
  std::vector<float> host(num_params());
  for (size_t ti = 0; ti < specs.size(); ++ti) {
    const TensorSpec& t = specs[ti];
    float* dst = host.data() + t.offset;
    const int64_t n = t.numel();
    if (t.group() == TensorGroup::Norm) {
      std::fill(dst, dst + n, 1.0f);
      continue;
    }
    const uint64_t stream = mix(seed * 0x100000001b3ULL + ti + 1);
    const double std_dev = cfg_.initializer_range;
#pragma omp parallel for schedule(static)
    for (int64_t e = 0; e < n; ++e) {
      // Box-Muller on two counter-based uniforms.
      const double u1 = uniform01(mix(stream ^ (2 * static_cast<uint64_t>(e)))),
                   u2 = uniform01(mix(stream ^ (2 * static_cast<uint64_t>(e) + 1)));
      dst[e] = static_cast<float>(std_dev * std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
    }
  }
  params_from_host(host);
  zero_grads();
}

void LlamaModel::zero_grads() {
  store_.zero_grads();
  ++grad_version_;
}

// ---------------------------------------------------------------------------------------------
// Inputs
// ---------------------------------------------------------------------------------------------

void LlamaModel::upload(const MicroBatch& mb, bool need_targets) {
  if (mb.B < 1 || mb.T < 1 || mb.B > max_batch_ || mb.T > max_seq_)
    throw Error("model: micro-batch " + std::to_string(mb.B) + " x " + std::to_string(mb.T) + " exceeds the planned " +
                std::to_string(max_batch_) + " x " + std::to_string(max_seq_));
  const int64_t BT = mb.B * mb.T, V = cfg_.vocab_size;
  auto check = [&](const int32_t* ids, const char* what, bool skip_masked) {
    for (int64_t i = 0; i < BT; ++i) {
      if (skip_masked && mb.loss_mask && !mb.loss_mask[i]) continue;
      if (ids[i] < 0 || ids[i] >= V)
        throw Error(std::string("model: ") + what + " id " + std::to_string(ids[i]) + " at (sequence " +
                    std::to_string(i / mb.T) + ", position " + std::to_string(i % mb.T) + ") is outside [0, " +
                    std::to_string(V) + ")");
    }
  };
  check(mb.tokens, "token", false);
  be_.to_device(tokens_, mb.tokens, BT * 4);
  if (need_targets) {
    if (!mb.targets) throw Error("model: the loss needs targets");
    check(mb.targets, "target", true);
    // Masked targets may hold anything (e.g. a pad id): the kernels never read them.
    be_.to_device(targets_, mb.targets, BT * 4);
    be_.to_device(mask_, mb.loss_mask ? mb.loss_mask : all_counted_.data(), BT);
  }
}

// ---------------------------------------------------------------------------------------------
// Forward
// ---------------------------------------------------------------------------------------------

void LlamaModel::forward_layers(int64_t B, int64_t T) {
  const int64_t BT = B * T, C = cfg_.hidden_size, H = cfg_.num_attention_heads, D = cfg_.head_dim();
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  Buf swiglu = act("swiglu");
  {
    auto t = time(Op::Embedding);
    be_.embedding_forward(a_[0].input, tokens_, wte_, BT, C);  // x0[BT,C] = wte[tokens]
  }
  for (size_t l = 0; l < a_.size(); ++l) {
    const LayerActs& A = a_[l];
    const Layer& L = layers_[l];
    Buf out = l + 1 < a_.size() ? a_[l + 1].input : act("final.input");
    { auto t = time(Op::RmsNorm);   be_.rmsnorm_forward(A.ln1, A.ln1_rstd, A.input, L.input_norm, BT, C, eps); }
    { auto t = time(Op::Matmul);    L.qkv.forward(be_, A.qkv, A.ln1, BT); }  // [BT,3C]
    { auto t = time(Op::Rope);      be_.rope_forward(A.qkv, rope_, B, T, H, D); }
    { auto t = time(Op::Attention); be_.attention_forward(A.attn_out, A.lse, A.qkv, B, T, H, D); }  // [BT,C]
    { auto t = time(Op::Matmul);    L.o.forward_residual(be_, A.mid, A.input, A.attn_out, BT); }  // mid = x + attn Wo^T
    { auto t = time(Op::RmsNorm);   be_.rmsnorm_forward(A.ln2, A.ln2_rstd, A.mid, L.post_norm, BT, C, eps); }
    { auto t = time(Op::MatmulSwiGLU); L.gate_up.forward_swiglu(be_, swiglu, A.gate_up, A.ln2, BT); }  // gate_up [BT,2F], s [BT,F]
    { auto t = time(Op::Matmul);    L.down.forward_residual(be_, out, A.mid, swiglu, BT); }  // out = mid + s Wdown^T
  }
  auto t = time(Op::RmsNorm);
  be_.rmsnorm_forward(act("final.ln"), act_f32("final.rstd"), act("final.input"), wnorm_, BT, C, eps);
}

// The loss head, in chunks of rows: logits, cross-entropy, and (backward) d_lnf and dWlm at once, so
// only one chunk of logits ever exists.
void LlamaModel::head(int64_t BT, bool backward, float grad_scale, float* host_logits) {
  const int64_t C = cfg_.hidden_size, V = cfg_.vocab_size;
  Buf lnf = act("final.ln"), logits = act("logits");
  Buf dlogits = dtype() == DType::F32 ? logits : act("d_logits");
  float* losses = act_f32("losses");
  float* d_lnf = act_f32("d_x");
  if (host_logits) {  // logits holds fewer rows than a chunk when the backend fuses the loss head
    const int64_t rows = plan_.find("logits").elements / V;
    for (int64_t r0 = 0; r0 < BT; r0 += rows) {
      const int64_t R = std::min(rows, BT - r0);
      { auto t = time(Op::Matmul); lm_head_.forward(be_, logits, lnf.at(r0 * C), R); }  // [R,V] f32
      be_.to_host(host_logits + r0 * V, logits.ptr, R * V * 4);
    }
    return;
  }
  for (int64_t r0 = 0; r0 < BT; r0 += kHeadChunkRows) {
    const int64_t R = std::min(kHeadChunkRows, BT - r0);
    {  // logits = lnf Wlm^T [R,V] f32 and the loss (fused on the CPU's AMX path: logits never stored)
      auto t = time(Op::LossHead);
      lm_head_.forward_cross_entropy(be_, losses + r0, backward ? dlogits : Buf{nullptr, dlogits.dtype}, logits, lnf.at(r0 * C),
                                     targets_ + r0, mask_ + r0, R, grad_scale);
    }
    if (backward) {
      auto t = time(Op::Matmul);
      lm_head_.backward_input(be_, Buf{d_lnf + r0 * C, DType::F32}, dlogits, R);  // d_lnf = dlogits Wlm
      lm_head_.backward_weight(be_, dlogits, lnf.at(r0 * C), R);                  // dWlm += dlogits^T lnf
    }
  }
}

// One call's loss: its losses summed on the backend into the call's own totals, read back.
LossSum LlamaModel::loss_of_this_call(int64_t BT) {
  LossTotals* mine = call_loss_;
  be_.zero({mine, DType::F32}, sizeof(LossTotals) / 4);
  be_.accumulate_loss(mine, act_f32("losses"), mask_, BT);
  LossTotals t;
  be_.to_host(&t, mine, sizeof(t));
  return {t.sum, static_cast<int64_t>(t.count)};
}

LossSum LlamaModel::forward(const MicroBatch& mb) {
  upload(mb, true);
  forward_layers(mb.B, mb.T);
  head(mb.B * mb.T, false, 0.0f, nullptr);
  return loss_of_this_call(mb.B * mb.T);
}

void LlamaModel::logits(const MicroBatch& mb, float* host_logits) {
  upload(mb, false);
  forward_layers(mb.B, mb.T);
  head(mb.B * mb.T, false, 0.0f, host_logits);
}

// ---------------------------------------------------------------------------------------------
// Backward
// ---------------------------------------------------------------------------------------------

LossSum LlamaModel::forward_backward(const MicroBatch& mb, float grad_scale) {
  queue_forward_backward(mb, grad_scale);
  return loss_of_this_call(mb.B * mb.T);
}

void LlamaModel::forward_backward_ops(int64_t B, int64_t T, float grad_scale) {
  const auto t0 = std::chrono::steady_clock::now();
  forward_layers(B, T);
  head(B * T, true, grad_scale, nullptr);  // the head's backward GEMMs count as forward
  const auto t1 = std::chrono::steady_clock::now();
  backward_layers(B, T);
  last_forward_s_ = std::chrono::duration<double>(t1 - t0).count();
  last_backward_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
}

// The forward and backward ops and the loss's sum into the update's totals: one graph (GraphCache)
// per shape and loss scale. The token upload stays outside (a copy from the host); the data-parallel
// micro-batch that starts the gradient reduction, and profiled ones, run eagerly.
void LlamaModel::queue_forward_backward(const MicroBatch& mb, float grad_scale) {
  const int64_t BT = mb.B * mb.T;
  upload(mb, true);
  ++grad_version_;
  auto ops = [&] {
    forward_backward_ops(mb.B, mb.T, grad_scale);
    be_.accumulate_loss(store_.update_loss_totals(), act_f32("losses"), mask_, BT);
  };
  if (store_.gradient_listener() || profile_.enabled) return ops();
  uint32_t scale_bits = 0;
  std::memcpy(&scale_bits, &grad_scale, 4);
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t replays = graphs_.replays();
  graphs_.run(std::to_string(mb.B) + "x" + std::to_string(mb.T) + "/" + std::to_string(scale_bits), ops);
  if (graphs_.replays() > replays) {  // one launch: the split is not seen from the host
    last_forward_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    last_backward_s_ = 0;
  }
}

void LlamaModel::backward_layers(int64_t B, int64_t T) {
  const int64_t BT = B * T, C = cfg_.hidden_size, H = cfg_.num_attention_heads, D = cfg_.head_dim();
  float* d_resid = act_f32("d_resid");  // dL/d(residual stream), FP32
  float* d_x = act_f32("d_x");          // FP32 output of the dX GEMMs
  Buf d_ln = act("d_ln"), d_attn_out = act("d_attn_out"), d_qkv = act("d_qkv"), swiglu = act("swiglu"),
      d_gate_up = act("d_gate_up");
  // SwiGLU's ds[BT,F]: not in the plan when the backend's fused backward never stores it.
  const Buf d_swiglu = plan_.has("d_swiglu") ? act("d_swiglu") : Buf{nullptr, dtype()};
  // Each RMSNorm backward writes d_resid (FP32) and its copy d_ln in the GEMM dtype: the residual
  // stream's gradient as the next projection's operand.
  {
    auto t = time(Op::RmsNorm);  // final norm: d_x holds d_lnf from the head
    be_.rmsnorm_backward(d_resid, d_ln, dwnorm_, d_x, act("final.input"), wnorm_, act_f32("final.rstd"), BT, C, false);
  }
  // Arena ranges final so far, reported in the store's gradient_ready_order().
  GradientListener* listener = store_.gradient_listener();
  const ArenaRanges& ready = store_.gradient_ready_order();
  size_t reported = 0;
  auto report = [&] {
    if (listener) listener->gradients_ready(ready[reported].first, ready[reported].second), ++reported;
  };
  auto progress = [&] {
    if (listener) listener->progress();
  };
  report();  // the head: lm_head's gradient came from head(), the final norm's from just above
  for (size_t l = a_.size(); l-- > 0;) {
    const LayerActs& A = a_[l];
    const Layer& L = layers_[l];
    // MLP branch: out = mid + swiglu(ln2 Wgu^T) Wdown^T; d_ln holds d_out
    // d_s[BT,F] = d_out Wdown, then d_gate_up and s = swiglu(gate_up), recomputed (not stored), in one pass
    { auto t = time(Op::MatmulSwiGLU); L.down.backward_input_swiglu(be_, d_gate_up, swiglu, d_swiglu, d_ln, A.gate_up, BT); }
    { auto t = time(Op::Matmul);  L.down.backward_weight(be_, d_ln, swiglu, BT); }  // dWdown[C,F] += d_out^T s
    progress();
    {
      auto t = time(Op::Matmul);
      L.gate_up.backward_weight(be_, d_gate_up, A.ln2, BT);                 // dWgu += d_gu^T ln2
      L.gate_up.backward_input(be_, Buf{d_x, DType::F32}, d_gate_up, BT);  // d_ln2 = d_gu Wgu
    }
    { auto t = time(Op::RmsNorm); be_.rmsnorm_backward(d_resid, d_ln, L.d_post_norm, d_x, A.mid, L.post_norm, A.ln2_rstd, BT, C, true); }
    progress();
    // Attention branch: mid = x + attention(RoPE(ln1 Wqkv^T)) Wo^T; d_ln holds d_mid
    {
      auto t = time(Op::Matmul);
      L.o.backward_weight(be_, d_ln, A.attn_out, BT);     // dWo += d_mid^T attn
      L.o.backward_input(be_, d_attn_out, d_ln, BT);      // d_attn = d_mid Wo
    }
    { auto t = time(Op::Attention); be_.attention_backward(d_qkv, d_attn_out, A.qkv, A.attn_out, A.lse, B, T, H, D); }
    progress();
    { auto t = time(Op::Rope);      be_.rope_backward(d_qkv, rope_, B, T, H, D); }
    progress();
    {
      auto t = time(Op::Matmul);
      L.qkv.backward_weight(be_, d_qkv, A.ln1, BT);                 // dWqkv += d_qkv^T ln1
      L.qkv.backward_input(be_, Buf{d_x, DType::F32}, d_qkv, BT);  // d_ln1 = d_qkv Wqkv
    }
    { auto t = time(Op::RmsNorm); be_.rmsnorm_backward(d_resid, d_ln, L.d_input_norm, d_x, A.input, L.input_norm, A.ln1_rstd, BT, C, true); }
    report();  // layer l
  }
  { auto t = time(Op::Embedding); be_.embedding_backward(dwte_, d_ln, tokens_, BT, C); }
  report();  // the embedding (and the tied lm_head)
}


// ---------------------------------------------------------------------------------------------
// Incremental decoding (KV cache)
// ---------------------------------------------------------------------------------------------

void LlamaModel::start_decoding() {
  const int64_t C = cfg_.hidden_size;
  if (!kv_cache_) kv_cache_ = be_.allocate(2 * cfg_.num_hidden_layers * max_seq_ * C * dtype_bytes(dtype()));
  decode_pos_ = 0;
}

// One token at position p = decode_position(), batch 1: the forward pass of forward_layers() on a
// single row, attention against the cache. Uses row 0 of the activation arena.
void LlamaModel::decode_step(int32_t token, float* host_logits) {
  if (!kv_cache_) throw Error("model: decode_step() before start_decoding()");
  if (decode_pos_ >= max_seq_)
    throw Error("model: the key/value cache holds " + std::to_string(max_seq_) + " positions; start_decoding() again");
  const int64_t C = cfg_.hidden_size, F = cfg_.intermediate_size, H = cfg_.num_attention_heads, D = cfg_.head_dim(),
                V = cfg_.vocab_size, p = decode_pos_;
  if (token < 0 || token >= V)
    throw Error("model: token id " + std::to_string(token) + " is outside [0, " + std::to_string(V) + ")");
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  be_.to_device(tokens_, &token, 4);
  be_.embedding_forward(a_[0].input, tokens_, wte_, 1, C);
  const Buf swiglu = act("swiglu");
  const Buf cache{kv_cache_, dtype()};
  for (size_t l = 0; l < a_.size(); ++l) {
    const LayerActs& A = a_[l];
    const Layer& L = layers_[l];
    const Buf out = l + 1 < a_.size() ? a_[l + 1].input : act("final.input");
    const Buf k_cache = cache.at((2 * l) * max_seq_ * C), v_cache = cache.at((2 * l + 1) * max_seq_ * C);
    be_.rmsnorm_forward(A.ln1, A.ln1_rstd, A.input, L.input_norm, 1, C, eps);
    L.qkv.forward(be_, A.qkv, A.ln1, 1);                 // [1,3C]
    be_.rope_forward(A.qkv, rope_ + p * D, 1, 1, H, D);  // the table's row for position p
    be_.attention_decode(A.attn_out, A.qkv, k_cache, v_cache, p, H, D);
    L.o.forward_residual(be_, A.mid, A.input, A.attn_out, 1);
    be_.rmsnorm_forward(A.ln2, A.ln2_rstd, A.mid, L.post_norm, 1, C, eps);
    L.gate_up.forward(be_, A.gate_up, A.ln2, 1);
    be_.swiglu_forward(swiglu, A.gate_up, 1, F);
    L.down.forward_residual(be_, out, A.mid, swiglu, 1);
  }
  be_.rmsnorm_forward(act("final.ln"), act_f32("final.rstd"), act("final.input"), wnorm_, 1, C, eps);
  const Buf logits = act("logits");
  lm_head_.forward(be_, logits, act("final.ln"), 1);  // [1,V] f32
  be_.to_host(host_logits, logits.ptr, V * 4);
  ++decode_pos_;
}

std::vector<GemmShape> training_step_gemms(const ModelConfig& m, int64_t BT) {
  const int64_t C = m.hidden_size, F = m.intermediate_size, V = m.vocab_size;
  const int l = static_cast<int>(m.num_hidden_layers);
  std::vector<GemmShape> g;
  auto add = [&](const std::array<GemmShape, 3>& three) { g.insert(g.end(), three.begin(), three.end()); };
  add(Linear::gemms(C, 3 * C, BT, l));                    // qkv
  add(Linear::gemms(C, C, BT, l));                        // o
  add(Linear::gemms(C, 2 * F, BT, l, true));              // gate/up, SwiGLU after its forward
  add(Linear::gemms(F, C, BT, l, false, true));           // down, SwiGLU's backward after its input gradient
  // The loss head, in chunks of kHeadChunkRows rows (the last one shorter when BT is not a multiple).
  const int64_t R = std::min(BT, kHeadChunkRows), full = BT / R, rest = BT - full * R;
  for (const auto& [rows, n] : {std::pair<int64_t, int64_t>{R, full}, {rest, rest > 0 ? 1 : 0}})
    if (n > 0) add(Linear::gemms(C, V, rows, static_cast<int>(n), true));
  return g;
}

}  // namespace multinorm
