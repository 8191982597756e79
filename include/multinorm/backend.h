// The backend seam. A backend owns every buffer (host memory on the CPU, device memory on CUDA) and
// runs every op of the model's forward and backward pass and of the optimizers. Model code holds
// Buf handles (pointer + dtype) and never dereferences them; tokens and losses cross the seam through
// explicit copies. Two implementations: CpuBackend (oneDNN GEMMs + OpenMP kernels, kernels/cpu/cpu_backend.cpp) and
// CudaBackend (cuBLASLt + hand-written kernels, kernels/cuda/), which lives in the dlopen'ed CUDA
// plugin and is created through make_backend (include/multinorm/device.h).
//
// A device backend queues its ops and returns at once: the order of its work, the host's waits for
// it and its graphs are its WorkQueue (work_queue.h), handed out by queue(); the CPU backend's ops are
// done when they return and its queue is synchronous.
//
// Conventions: row-major storage; "act" tensors are stored in the parameter dtype (bf16 or fp32);
// every reduction accumulates in FP32; ops are deterministic for a given thread count.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include <vector>

#include "multinorm/activation_plan.h"
#include "multinorm/communicator.h"
#include "multinorm/dtype.h"
#include "multinorm/error.h"
#include "multinorm/update_scalars.h"
#include "multinorm/work_queue.h"
#include "multinorm/write_back.h"

namespace multinorm {

struct Buf {
  void* ptr = nullptr;
  DType dtype = DType::F32;
  // A matrix whose rows are padded: its row stride in elements (0: rows are dense, as the op's width
  // says). Only the CUDA backend's plan pads (the MLP's activations: ActivationLayout), and only the
  // ops that take them honour it (matmul, swiglu and their fused forms); every other op refuses one.
  // Its padding holds zeros: allocate() zero-fills, ops write only the row's columns, and a GEMM over
  // the padded width writes there a row of its input times zeros (cuda_scratch::gemm_extents).
  int64_t ld = 0;
  Buf at(int64_t elements) const {
    return {static_cast<char*>(ptr) + elements * dtype_bytes(dtype), dtype, ld};
  }
  float* f32() const { return static_cast<float*>(ptr); }
  // The row stride of a matrix of `cols` columns.
  int64_t stride(int64_t cols) const { return ld ? ld : cols; }
};

// Arguments of the per-tensor optimizer ops. Every update computes u in FP32 and writes
//   w <- w * (1 - lr * decoupled_decay) - lr * u      (rounded per WriteBack)
// With `scalars` set, the op takes its learning rate (and what is derived from it), Adam's bias
// corrections and write.step from that slot of the UpdateScalars in backend memory when it runs, and
// changes nothing when the update's statistics say skip (update_scalars.h); lr, step and write.step
// here are then not used.
struct SinkGDArgs {
  float lr = 0, decoupled_decay = 0;
  int iterations = 5;  // L
  float eps = 1e-8f;   // floor on row/column norms
  WriteBack write;
  ScalarsRef scalars;
};
struct SwanArgs {
  float lr = 0, decoupled_decay = 0;
  bool standardize = false;  // rows: subtract mean, divide by std (SWAN paper) instead of l2
  bool exact = false;        // exact FP64 eigendecomposition instead of Newton-Schulz
  int ns_steps = 10;
  float ns_tolerance = 0;    // stop when ||I - Y Z||_F / sqrt(m) < tolerance (0: all steps)
  float eps = 1e-8f;
  WriteBack write;
  ScalarsRef scalars;
  SwanStats* stats = nullptr;  // backend memory the op adds its Newton-Schulz statistics to (null: none)
};
// One tensor of a multi-tensor SWAN update: its buffers, shape and stochastic-rounding tensor id.
struct SwanTensor {
  Buf w, g;
  int64_t m = 0, n = 0;  // rows, columns
  uint64_t tensor = 0;
};
struct AdamArgs {
  float lr = 0, eps = 1e-8f;
  double beta1 = 0.9, beta2 = 0.999;  // double: 1 - beta is formed exactly, then rounded (as torch does)
  float l2_decay = 0;         // torch.optim.Adam's weight_decay: g += l2_decay * w
  float decoupled_decay = 0;  // torch.optim.AdamW's: w *= 1 - lr * decoupled_decay
  int64_t step = 1;           // t of the bias correction, from 1
  WriteBack write;
  ScalarsRef scalars;
};
// One tensor of a multi-tensor SinkGD update: its buffers, shape and stochastic-rounding tensor id.
struct SinkGDTensor {
  Buf w, g;
  int64_t m = 0, n = 0;  // rows, columns
  uint64_t tensor = 0;
};
// One tensor of a multi-tensor Adam update: its buffers, length and stochastic-rounding tensor id.
struct AdamTensor {
  Buf w, g, m, v;
  int64_t n = 0;
  uint64_t tensor = 0;
};
struct SgdArgs {
  float lr = 0, momentum = 0, decoupled_decay = 0;
  WriteBack write;
  ScalarsRef scalars;
};
// Device time of one kernel (or cuBLASLt call) summed over its launches, from Backend::take_profile.
struct KernelTime {
  std::string name;
  int64_t launches = 0;
  double ms = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual int threads() const = 0;
  // Whether buffers from allocate() are host memory a caller may hand to the host (MPI, memcpy)
  // directly; otherwise every crossing goes through to_host / to_device.
  virtual bool host_memory() const = 0;
  // The order of this backend's work: fences, waits, late copies to the host, graphs, counters.
  virtual WorkQueue& queue() = 0;
  // Bytes of scratch the backend holds now (grown on first use, reused after; counted by
  // multinorm info as backend_scratch_bytes).
  virtual int64_t workspace_bytes() const = 0;
  // The activation scratch this backend's fused kernels never write for activations of dtype `act`
  // (matmul_swiglu_backward's ds, linear_cross_entropy's logits): the model's plan leaves it out.
  virtual ActivationLayout activation_layout(DType act) const {
    (void)act;
    return {};
  }
  // Per-kernel device times (CUDA events around every launch) while profiling is on; take_profile()
  // waits for the device and returns the totals since the last take, largest first. A backend
  // without device kernels returns none.
  virtual void set_profiling(bool on) { (void)on; }
  virtual std::vector<KernelTime> take_profile() { return {}; }

  // ---- memory ---------------------------------------------------------------------------------
  virtual void* allocate(int64_t bytes) = 0;  // zero-filled, 64-byte aligned
  virtual void release(void* ptr) = 0;
  virtual void to_device(void* dst, const void* host_src, int64_t bytes) = 0;
  // Waits for the copy (and so for every op issued before it): a host wait.
  virtual void to_host(void* host_dst, const void* src, int64_t bytes) = 0;
  virtual void zero(Buf x, int64_t n) = 0;
  virtual void convert(Buf dst, Buf src, int64_t n) = 0;  // copy with dtype conversion (RNE to bf16)

  // ---- GEMM -----------------------------------------------------------------------------------
  // out[M,N] = op(a)[M,K] * op(b)[K,N]  (+ out when accumulate). op(x) = x^T when trans_x, where a
  // transposed operand is stored [K,M] (a) or [N,K] (b). a and b share a dtype; out may differ
  // (bf16 x bf16 -> fp32 is the mixed-precision path). FP32 accumulation always.
  virtual void matmul(Buf out, Buf a, Buf b, int64_t M, int64_t N, int64_t K, bool trans_a, bool trans_b,
                      bool accumulate) = 0;

  // ---- model ops (BT rows of width C unless noted) --------------------------------------------
  // out[BT,C] = wte[tokens[i], :]
  virtual void embedding_forward(Buf out, const int32_t* tokens, Buf wte, int64_t BT, int64_t C) = 0;
  // dwte[tokens[i], :] += dout[i, :], summed per token in FP32 then added once. dwte in dout's dtype,
  // or FP32 (the FP32 gradient arena); the same holds for rmsnorm_backward's dw.
  virtual void embedding_backward(Buf dwte, Buf dout, const int32_t* tokens, int64_t BT, int64_t C) = 0;
  // out = x * rstd * w, rstd[i] = 1/sqrt(mean(x_i^2) + eps)
  virtual void rmsnorm_forward(Buf out, float* rstd, Buf x, Buf w, int64_t N, int64_t C, float eps) = 0;
  // dx (=, or += when accumulate_dx) and dw (+=) from dout; dout and dx are FP32 (GEMM outputs and
  // the residual-stream gradient)
  virtual void rmsnorm_backward(float* dx, Buf dw, const float* dout, Buf x, Buf w, const float* rstd, int64_t N,
                                int64_t C, bool accumulate_dx) = 0;
  // In place on the q and k sections of qkv[B*T, 3*H*D]: rotate-half RoPE, cos_sin[T, D/2, 2]
  virtual void rope_forward(Buf qkv, const float* cos_sin, int64_t B, int64_t T, int64_t H, int64_t D) = 0;
  virtual void rope_backward(Buf dqkv, const float* cos_sin, int64_t B, int64_t T, int64_t H, int64_t D) = 0;
  // Causal softmax attention, scale 1/sqrt(D). out[B*T, H*D]; lse[B, H, T] (log-sum-exp of each row,
  // saved so the backward pass recomputes probabilities instead of storing them).
  virtual void attention_forward(Buf out, float* lse, Buf qkv, int64_t B, int64_t T, int64_t H, int64_t D) = 0;
  virtual void attention_backward(Buf dqkv, Buf dout, Buf qkv, Buf out, const float* lse, int64_t B, int64_t T,
                                  int64_t H, int64_t D) = 0;
  // Incremental decoding (batch 1): appends the k and v of qkv[3*H*D] (one position, q and k rotated)
  // as row `pos` of k_cache, v_cache [max_T, H*D], and writes out[H*D], the causal attention of q over
  // cache rows 0..pos.
  virtual void attention_decode(Buf out, Buf qkv, Buf k_cache, Buf v_cache, int64_t pos, int64_t H, int64_t D) = 0;
  // out[N,F] = silu(gate) * up, gate_up[N, 2F] = [gate | up]
  virtual void swiglu_forward(Buf out, Buf gate_up, int64_t N, int64_t F) = 0;
  // dgate_up[N,2F] from dout[N,F]; with out.ptr set, also out[N,F] = the forward's output (the same
  // bits as swiglu_forward), for a backward that recomputes it: one pass over gate_up instead of two.
  virtual void swiglu_backward(Buf dgate_up, Buf out, Buf dout, Buf gate_up, int64_t N, int64_t F) = 0;
  // The MLP's up projection and activation: gate_up[N,2F] = x[N,C] w[2F,C]^T, then out[N,F] =
  // swiglu(gate_up). A backend may fuse them (the CPU's AMX path applies SwiGLU to 32 rows of gate_up
  // while they are in its cache: the same bits). The default is the GEMM, then swiglu_forward.
  virtual void matmul_swiglu(Buf out, Buf gate_up, Buf x, Buf w, int64_t N, int64_t F, int64_t C) {
    matmul(gate_up, x, w, N, 2 * F, C, false, true, false);
    swiglu_forward(out, gate_up, N, F);
  }
  // Its backward from the down projection's output gradient dy[N,C]: ds[N,F] = dy w_down[C,F], then
  // swiglu_backward(dgate_up, out, ds, gate_up). ds is scratch the caller provides; a backend may fuse
  // the two and never write it (the same bits). The default is the GEMM, then swiglu_backward.
  virtual void matmul_swiglu_backward(Buf dgate_up, Buf out, Buf ds, Buf dy, Buf w_down, Buf gate_up, int64_t N,
                                      int64_t F, int64_t C) {
    matmul(ds, dy, w_down, N, F, C, false, false, false);
    swiglu_backward(dgate_up, out, ds, gate_up, N, F);
  }
  // Row-wise softmax cross-entropy of logits[N,V] (FP32). losses[i] = lse - logit[target] (0 where
  // masked). With dlogits non-null: dlogits = (softmax - onehot) * grad_scale (0 where masked);
  // dlogits may alias logits when both are FP32.
  virtual void cross_entropy(float* losses, Buf dlogits, const float* logits, const int32_t* targets,
                             const uint8_t* mask, int64_t N, int64_t V, float grad_scale) = 0;
  // totals (backend memory) += one micro-batch's losses[N] over the positions where mask[i] (the FP64
  // sum in optim_math's fixed lane order: the same bits on every backend), their count and mean
  // (optim_math::add_micro_batch_loss; nothing when no position counts).
  virtual void accumulate_loss(LossTotals* totals, const float* losses, const uint8_t* mask, int64_t N) = 0;
  // The loss head: cross_entropy (as above) of logits[N,V] = x[N,C] w[V,C]^T, FP32. `logits` is FP32
  // scratch of N V the caller provides; a backend may fuse the two and never write it (the CPU's AMX
  // path computes 32 rows of logits at a time and runs the cross-entropy on them while they are in
  // cache: the same bits). The default is the GEMM, then cross_entropy.
  virtual void linear_cross_entropy(float* losses, Buf dlogits, Buf logits, Buf x, Buf w, const int32_t* targets,
                                    const uint8_t* mask, int64_t N, int64_t V, int64_t C, float grad_scale) {
    matmul(logits, x, w, N, V, C, false, true, false);
    cross_entropy(losses, dlogits, logits.f32(), targets, mask, N, V, grad_scale);
  }

  // ---- optimizer ops: one tensor per call (the _many ops: a list). w in the parameter dtype; g the
  // same, or FP32 gradients of BF16 weights (precision.grads = fp32) ------------------------------
  // The FP64 sum of squares of x[n], read back (a host wait: the checkpoint's check that the weights
  // are finite).
  virtual double sum_squares(Buf x, int64_t n) = 0;
  // out[i] = sum_squares(xs[i], ns[i]) for `count` tensors, into backend memory, with no host wait
  // (each the same number as one sum_squares call gives).
  virtual void sum_squares_many(const Buf* xs, const int64_t* ns, int64_t count, double* out) = 0;
  virtual void scale(Buf x, int64_t n, float factor) = 0;
  // An update's statistics where the gradients are, with no host wait: s->stats (backend memory) from
  // the per-tensor sums of squares squares[count] and the loss totals (both backend memory, over every
  // rank), the clip threshold grad_clip (0: none) and s's spike threshold, skip_spikes and
  // token_mean (optim_math::finish_statistics). The host reads them when it likes.
  virtual void update_statistics(UpdateScalars* s, const LossTotals* loss, const double* squares, int64_t count, double grad_clip) = 0;
  // x[n] *= s->stats.clip_factor, read where the op runs; nothing when the factor is 1 or the update
  // is skipped. The same bits as scale(x, n, factor).
  virtual void clip_gradients(Buf x, int64_t n, const UpdateScalars* s) = 0;
  // SinkGD on W[m,n] (fused: X = diag(u) G diag(v) is never materialised); see kernels/cpu/sinkgd.cpp
  virtual void sinkgd_update(Buf w, Buf g, int64_t m, int64_t n, const SinkGDArgs& args) = 0;
  // SinkGD on many tensors with the same arguments (args.write.tensor is replaced by each tensor's
  // id). The results equal sinkgd_update on each tensor; a backend may run them in any order or
  // together (the CPU runs whole tensors on separate cores, so one tensor's memory traffic overlaps
  // another's passes). The default updates them one by one.
  virtual void sinkgd_update_many(const SinkGDTensor* tensors, int64_t count, const SinkGDArgs& args) {
    for (int64_t i = 0; i < count; ++i) {
      SinkGDArgs a = args;
      a.write.tensor = tensors[i].tensor;
      sinkgd_update(tensors[i].w, tensors[i].g, tensors[i].m, tensors[i].n, a);
    }
  }
  // SWAN: row normalisation then whitening sqrt(max(m,n)) (X X^T)^(-1/2) X (X (X^T X)^(-1/2) when
  // m > n), so ||U||_F = sqrt(mn); see kernels/cpu/swan.cpp. On many tensors with the same arguments
  // (args.write.tensor is replaced by each tensor's id): a device batches the Newton-Schulz products
  // of tensors with one Gram size. Each tensor's Newton-Schulz stops where the CPU's would (its
  // residual under ns_tolerance), decided where the op runs; its statistics are added to args.stats.
  virtual void swan_update_many(const SwanTensor* tensors, int64_t count, const SwanArgs& args) = 0;
  void swan_update(Buf w, Buf g, int64_t m, int64_t n, const SwanArgs& args) {
    const SwanTensor t{w, g, m, n, args.write.tensor};
    swan_update_many(&t, 1, args);
  }
  // Adam/AdamW with torch semantics; states m, v in their own dtype
  virtual void adam_update(Buf w, Buf g, Buf m, Buf v, int64_t n, const AdamArgs& args) = 0;
  // Adam on many tensors with the same arguments (args.write.tensor is replaced by each tensor's id):
  // one launch on a device backend, for the many small tensors (norm weights) where per-tensor launch
  // overhead would dominate. The results equal adam_update on each tensor.
  virtual void adam_update_many(const AdamTensor* tensors, int64_t count, const AdamArgs& args) = 0;
  // SGD, torch semantics: buf = momentum * buf + g, w -= lr * buf (no buffer when momentum is 0)
  virtual void sgd_update(Buf w, Buf g, Buf momentum_buf, int64_t n, const SgdArgs& args) = 0;

  // ---- collectives over this backend's memory (data parallelism) -------------------------------
  // A device backend brings its own communicator (NCCL on CUDA): rank 0 calls collective_id(), the
  // bytes reach every rank over MPI, and each calls create_communicator() with them. Its collectives
  // run on a stream of their own, ordered after the ops issued before each call. A host-memory
  // backend has none (data parallelism uses MPI on its buffers directly).
  virtual std::vector<uint8_t> collective_id() { return {}; }
  virtual std::unique_ptr<Communicator> create_communicator(const std::vector<uint8_t>& id, int rank, int size,
                                                            double timeout_s) {
    (void)id, (void)rank, (void)size, (void)timeout_s;
    throw Error(name() + ": no device communicator (host memory goes through MPI)");
  }
};

// The CPU backend with `threads` OpenMP threads (0: all cores).
std::unique_ptr<Backend> make_cpu_backend(int threads = 0);
// The CPU backend's activation_layout on this machine (the memory estimate asks it without a backend).
ActivationLayout cpu_activation_layout(DType act);
// What runs the CPU backend's BF16 GEMMs here: "AMX tiles", "AVX512_BF16 VDPBF16PS" (the packed GEMM) or "oneDNN".
std::string cpu_bf16_gemm_engine();

}  // namespace multinorm
