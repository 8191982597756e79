// The backend seam. A backend owns every buffer (host memory on the CPU, device memory on CUDA) and
// runs every op of the model's forward and backward pass and of the optimizers. Model code holds
// Buf handles (pointer + dtype) and never dereferences them; tokens and losses cross the seam through
// explicit copies. Two implementations: CpuBackend (oneDNN GEMMs + OpenMP kernels, src/backend/) and
// the CUDA backend (kernels/cuda/, loaded as a plugin), which is tested op by op against the CPU.
//
// Conventions: row-major storage; "act" tensors are stored in the parameter dtype (bf16 or fp32);
// every reduction accumulates in FP32; ops are deterministic for a given thread count.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "multinorm/dtype.h"

namespace multinorm {

struct Buf {
  void* ptr = nullptr;
  DType dtype = DType::F32;
  Buf at(int64_t elements) const {
    return {static_cast<char*>(ptr) + elements * dtype_bytes(dtype), dtype};
  }
  float* f32() const { return static_cast<float*>(ptr); }
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual int threads() const = 0;

  // ---- memory ---------------------------------------------------------------------------------
  virtual void* allocate(int64_t bytes) = 0;  // zero-filled, 64-byte aligned
  virtual void release(void* ptr) = 0;
  virtual void to_device(void* dst, const void* host_src, int64_t bytes) = 0;
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
  // dwte[tokens[i], :] += dout[i, :], summed per token in FP32 then added once
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
  // out[N,F] = silu(gate) * up, gate_up[N, 2F] = [gate | up]
  virtual void swiglu_forward(Buf out, Buf gate_up, int64_t N, int64_t F) = 0;
  virtual void swiglu_backward(Buf dgate_up, Buf dout, Buf gate_up, int64_t N, int64_t F) = 0;
  // Row-wise softmax cross-entropy of logits[N,V] (FP32). losses[i] = lse - logit[target] (0 where
  // masked). With dlogits non-null: dlogits = (softmax - onehot) * grad_scale (0 where masked);
  // dlogits may alias logits when both are FP32.
  virtual void cross_entropy(float* losses, Buf dlogits, const float* logits, const int32_t* targets,
                             const uint8_t* mask, int64_t N, int64_t V, float grad_scale) = 0;
};

// The CPU backend with `threads` OpenMP threads (0: all cores).
std::unique_ptr<Backend> make_cpu_backend(int threads = 0);

}  // namespace multinorm
