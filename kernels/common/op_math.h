// Scalar math shared by the CPU kernels (kernels/cpu/) and the CUDA kernels (kernels/cuda/): one
// definition of each formula, compiled for the host and, under nvcc, for the device. Inputs and
// outputs are FP32; storage conversions stay in each backend.
#pragma once

#include "host_device.h"

namespace multinorm::op_math {

// The embedding's backward sums each token's positions (sorted by token, then position) in FP32 in
// pieces: the sorted order is cut every kEmbeddingSumChunk positions, each piece summed from zero,
// the pieces added in order, the total added to the token's row once. Both backends follow it (the
// CUDA one sums the pieces in parallel), so their bits agree; a run inside one piece is a plain sum.
constexpr int kEmbeddingSumChunk = 32;

// RoPE, rotate-half pairing (i, i + D/2) at angle p * theta^(-2i/D); c, s = cos, sin of the angle.
// The backward pass is the inverse rotation: the same call with -s.
MN_HOST_DEVICE void rope_rotate(float a, float b, float c, float s, float& a_out, float& b_out) {
  a_out = a * c - b * s;
  b_out = b * c + a * s;
}

// SwiGLU, given sig = sigmoid(g):  out = silu(g) * u
MN_HOST_DEVICE float swiglu(float g, float sig, float u) { return g * sig * u; }
//   dg = dout * u * sig * (1 + g * (1 - sig)),   du = dout * silu(g)
MN_HOST_DEVICE void swiglu_grad(float g, float sig, float u, float dout, float& dg, float& du) {
  dg = dout * u * sig * (1.0f + g * (1.0f - sig));
  du = dout * g * sig;
}

// RMSNorm's statistic, rstd = 1 / sqrt(ss / C + eps) given inv_sqrt of its argument, from the FP32
// sum of squares ss of a row. A row with an Inf or NaN has a non-finite ss (its squares are
// non-negative: nothing cancels), as has a finite row whose squares overflow FP32 (|x| > 1.8e19,
// which activations reach only when training diverges). Then rstd is NaN, so the whole row comes
// out NaN and the divergence shows in the loss: 1 / sqrt(inf) = 0 would turn the row into zeros,
// the loss into ln V and the gradient norm into 0, a run that looks alive.
MN_HOST_DEVICE float rmsnorm_rstd(float ss, float inv_sqrt_of_mean_plus_eps) {
  const float d = ss - ss;  // NaN exactly when ss is Inf or NaN (no fast-math build folds it to 0)
  return d == 0.0f ? inv_sqrt_of_mean_plus_eps : d;
}

// RMSNorm backward for one element, with xh = x * rstd and mean = mean_c(dout_c * w_c * xh_c):
//   dx = rstd * (dout * w - xh * mean)
MN_HOST_DEVICE float rmsnorm_dx(float dout, float w, float xh, float rstd, float mean) { return rstd * (dout * w - xh * mean); }

}  // namespace multinorm::op_math
