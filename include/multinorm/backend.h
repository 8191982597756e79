// The backend seam. A backend owns every buffer (host memory on the CPU, device memory on CUDA) and
// runs every op of the model's forward and backward pass; the optimizers' ops are its
// OptimizerKernels (optimizer_kernels.h), which it hands out. Model code holds
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
#include "multinorm/optimizer_kernels.h"
#include "multinorm/update_scalars.h"
#include "multinorm/work_queue.h"
#include "multinorm/write_back.h"

namespace multinorm {

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
  // out[M,N] = residual[M,N] + op(a) op(b): a residual connection's projection, which keeps the stream
  // it adds to (both are saved for the backward pass). out and residual: one dtype, dense rows. The
  // default copies residual into out, then accumulates; a backend may read residual as the GEMM's
  // addend instead (the CUDA backend: cuBLASLt's C operand, one pass over out instead of three).
  virtual void matmul_residual(Buf out, Buf residual, Buf a, Buf b, int64_t M, int64_t N, int64_t K, bool trans_a, bool trans_b) {
    convert(out, residual, M * N);
    matmul(out, a, b, M, N, K, trans_a, trans_b, true);
  }

  // ---- model ops (BT rows of width C unless noted) --------------------------------------------
  // out[BT,C] = wte[tokens[i], :]
  virtual void embedding_forward(Buf out, const int32_t* tokens, Buf wte, int64_t BT, int64_t C) = 0;
  // dwte[tokens[i], :] += dout[i, :], summed per token in FP32 then added once. dwte in dout's dtype,
  // or FP32 (the FP32 gradient arena); the same holds for rmsnorm_backward's dw.
  virtual void embedding_backward(Buf dwte, Buf dout, const int32_t* tokens, int64_t BT, int64_t C) = 0;
  // out = x * rstd * w, rstd[i] = 1/sqrt(mean(x_i^2) + eps)
  virtual void rmsnorm_forward(Buf out, float* rstd, Buf x, Buf w, int64_t N, int64_t C, float eps) = 0;
  // dx (=, or += when accumulate_dx) and dw (+=) from dout; dout and dx are FP32 (GEMM outputs and
  // the residual-stream gradient). With dx_copy.ptr set (x's dtype), dx's new values are also written
  // there, rounded (RNE): the next projection's operand, without a pass of its own.
  virtual void rmsnorm_backward(float* dx, Buf dx_copy, Buf dw, const float* dout, Buf x, Buf w, const float* rstd, int64_t N,
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

  // ---- the optimizers' kernels: handed out like the queue (optimizer_kernels.h) ----------------
  virtual OptimizerKernels& optimizer_kernels() = 0;

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
