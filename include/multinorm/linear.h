// A projection of the model, y[N, out] = x[N, in] W^T with W stored [out, in] (Hugging Face's
// layout): the one place the model asks a backend for its GEMMs, three per projection:
//
//   forward          y[N, out]  = x W^T   (+ r: a residual stream)           matmul(x, W, trans_b)
//   backward_input   dx[N, in]  = dy W                                       matmul(dy, W)
//   backward_weight  dW[out, in] += dy^T x                                   matmul(dy, x, trans_a)
//
// and, for the MLP, the forms with SwiGLU fused where a backend fuses it (the gate/up projection's
// forward, the down projection's backward_input). Layout and precision are decided here and in the
// backend behind it (the CUDA backend stages rows off 16 bytes through 128-byte rows:
// cuda_scratch::gemm_staging); gemms() lists the shapes for the memory plan and the cost model.
#pragma once
#include <array>
#include <cstdint>

#include "multinorm/backend.h"

namespace multinorm {

// One GEMM's shape as Backend::matmul takes it, repeated `count` times in a step. row_strips: the
// GEMM whose output a fused SwiGLU epilogue consumes in row strips on the CPU (matmul_packed.h);
// accumulate: out += (the weight gradient).
struct GemmShape {
  int64_t M, N, K;
  bool trans_a, trans_b;
  int count;
  bool row_strips = false, accumulate = false;
};

struct Linear {
  Buf w, dw;  // the weight [out, in] and its gradient (the gradient arena's dtype)
  int64_t in = 0, out = 0;

  void forward(Backend& be, Buf y, Buf x, int64_t N) const { be.matmul(y, x, w, N, out, in, false, true, false); }
  // A residual connection's projection: y = r + x W^T, r kept as it was (Backend::matmul_residual).
  void forward_residual(Backend& be, Buf y, Buf r, Buf x, int64_t N) const { be.matmul_residual(y, r, x, w, N, out, in, false, true); }
  // The gate/up projection (out = 2F): y = [gate | up] = x W^T, then s[N, F] = silu(gate) * up.
  void forward_swiglu(Backend& be, Buf s, Buf y, Buf x, int64_t N) const { be.matmul_swiglu(s, y, x, w, N, out / 2, in); }
  // The loss head (out = V): the logits and their cross-entropy, dlogits when given (Backend::linear_cross_entropy).
  void forward_cross_entropy(Backend& be, float* losses, Buf dlogits, Buf logits, Buf x, const int32_t* targets, const uint8_t* mask,
                             int64_t N, float grad_scale) const {
    be.linear_cross_entropy(losses, dlogits, logits, x, w, targets, mask, N, out, in, grad_scale);
  }
  void backward_input(Backend& be, Buf dx, Buf dy, int64_t N) const { be.matmul(dx, dy, w, N, in, out, false, false, false); }
  // The down projection (in = F): ds = dy W, then SwiGLU's backward into dgate_up, s recomputed.
  void backward_input_swiglu(Backend& be, Buf dgate_up, Buf s, Buf ds, Buf dy, Buf gate_up, int64_t N) const {
    be.matmul_swiglu_backward(dgate_up, s, ds, dy, w, gate_up, N, in, out);
  }
  void backward_weight(Backend& be, Buf dy, Buf x, int64_t N) const { be.matmul(dw, dy, x, out, in, N, true, false, true); }

  // The three GEMMs of a projection of `in` to `out` over N rows, `count` of them a step: forward,
  // backward_input, backward_weight. swiglu_forward / swiglu_input mark the fused forms.
  static std::array<GemmShape, 3> gemms(int64_t in, int64_t out, int64_t N, int count, bool swiglu_forward = false,
                                        bool swiglu_input = false) {
    return {GemmShape{N, out, in, false, true, count, swiglu_forward}, GemmShape{N, in, out, false, false, count, swiglu_input},
            GemmShape{out, in, N, true, false, count, false, true}};
  }
};

}  // namespace multinorm
