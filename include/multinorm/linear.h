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
// cuda_scratch::gemm_staging; the gate/up projection over the CUDA plan's padded rows runs by halves,
// gate and up each a GEMM over whole packs: halves()); gemms() lists the logical shapes (the FLOPs,
// the CPU's GEMMs).
#pragma once
#include <array>
#include <cstdint>
#include <string>

#include "multinorm/backend.h"
#include "multinorm/cuda_scratch.h"
#include "multinorm/error.h"

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
  bool gated = false;  // the gate/up projection: W = [gate; up], out = 2F
  int64_t up_row = 0;  // gated: the up half's first row in W and dW (F, or F and zero rows: TensorSpec::arena_rows)

  void forward(Backend& be, Buf y, Buf x, int64_t N) const {
    if (!halves(y)) return be.matmul(y, x, w, N, out, in, false, true, false);
    const int64_t E = extent(y);
    be.matmul(y, x, w, N, E, in, false, true, false);                     // gate = x Wgate^T
    be.matmul(up_half(y), x, w.at(E * in), N, E, in, false, true, false);  // up = x Wup^T
  }
  // A residual connection's projection: y = r + x W^T, r kept as it was (Backend::matmul_residual).
  void forward_residual(Backend& be, Buf y, Buf r, Buf x, int64_t N) const { be.matmul_residual(y, r, x, w, N, out, in, false, true); }
  // The gate/up projection (out = 2F): y = [gate | up] = x W^T, then s[N, F] = silu(gate) * up.
  void forward_swiglu(Backend& be, Buf s, Buf y, Buf x, int64_t N) const {
    if (!halves(y)) return be.matmul_swiglu(s, y, x, w, N, half(), in);
    forward(be, y, x, N);
    be.swiglu_forward(s, y, N, half());
  }
  // The loss head (out = V): the logits and their cross-entropy, dlogits when given (Backend::linear_cross_entropy).
  void forward_cross_entropy(Backend& be, float* losses, Buf dlogits, Buf logits, Buf x, const int32_t* targets, const uint8_t* mask,
                             int64_t N, float grad_scale) const {
    be.linear_cross_entropy(losses, dlogits, logits, x, w, targets, mask, N, out, in, grad_scale);
  }
  // dx = dy W; by halves, dx = dgate Wgate + dup Wup, the second added in FP32 (a BF16 dx would be
  // rounded twice, and no plan asks for one).
  void backward_input(Backend& be, Buf dx, Buf dy, int64_t N) const {
    if (!halves(dy)) return be.matmul(dx, dy, w, N, in, out, false, false, false);
    if (dx.dtype != DType::F32) throw Error("Linear: the gate/up projection's input gradient by halves needs an FP32 output");
    const int64_t E = extent(dy);
    be.matmul(dx, dy, w, N, in, E, false, false, false);
    be.matmul(dx, up_half(dy), w.at(E * in), N, in, E, false, false, true);
  }
  // The down projection (in = F): ds = dy W, then SwiGLU's backward into dgate_up, s recomputed.
  void backward_input_swiglu(Backend& be, Buf dgate_up, Buf s, Buf ds, Buf dy, Buf gate_up, int64_t N) const {
    be.matmul_swiglu_backward(dgate_up, s, ds, dy, w, gate_up, N, in, out);
  }
  void backward_weight(Backend& be, Buf dy, Buf x, int64_t N) const {
    if (!halves(dy)) return be.matmul(dw, dy, x, out, in, N, true, false, true);
    const int64_t E = extent(dy);
    be.matmul(dw, dy, x, E, in, N, true, false, true);                  // dWgate += dgate^T x
    be.matmul(dw.at(E * in), up_half(dy), x, E, in, N, true, false, true);  // dWup += dup^T x
  }

  // Whether a gated projection's [gate | up] activation y (or its gradient) holds its up half apart
  // from the gate's, on a 16-byte pack (the CUDA plan's padded rows: cuda_scratch::mlp_up_column):
  // then each half is a GEMM of its own, every operand aligned. Otherwise W must be [gate; up] with
  // no rows between (one GEMM over its 2F rows).
  bool halves(const Buf& y) const {
    const bool apart = gated && up_column(y) != half();
    if (gated && !apart && up_row != half())
      throw Error("Linear: a dense gate/up activation over a weight whose up half starts at row " + std::to_string(up_row) + ", not " +
                  std::to_string(half()) + " (the activation plan and the arena's layout disagree)");
    return apart;
  }
  int64_t half() const { return out / 2; }
  int64_t up_column(const Buf& y) const { return cuda_scratch::mlp_up_column(half(), y.ld, dtype_bytes(y.dtype)); }
  Buf up_half(const Buf& y) const { return y.at(up_column(y)); }
  // The halves' extent E: F rounded up to whole packs, the up half's column in y and its row in W.
  // Each half's three GEMMs run over E rows of W and dW (its F rows and the zero rows after them) and
  // E columns of y or dy (its F columns and the plan's padding after them): the forward writes zeros
  // to y's padding (x times zero rows), the input gradient adds exact zeros (dy's padding, which
  // SwiGLU never writes, times zero rows), the weight gradient adds zeros to dW's zero rows.
  int64_t extent(const Buf& y) const {
    const int64_t E = up_column(y);
    if (E != up_row)
      throw Error("Linear: the gate/up activation's up half starts at column " + std::to_string(E) + ", its weight's at row " +
                  std::to_string(up_row) + " (the activation plan and the arena's layout disagree)");
    return E;
  }

  // The three GEMMs of a projection of `in` to `out` over N rows, `count` of them a step: forward,
  // backward_input, backward_weight. swiglu_forward / swiglu_input mark the fused forms.
  static std::array<GemmShape, 3> gemms(int64_t in, int64_t out, int64_t N, int count, bool swiglu_forward = false,
                                        bool swiglu_input = false) {
    return {GemmShape{N, out, in, false, true, count, swiglu_forward}, GemmShape{N, in, out, false, false, count, swiglu_input},
            GemmShape{out, in, N, true, false, count, false, true}};
  }
};

}  // namespace multinorm
