// Scalar math shared by the CPU kernels (kernels/cpu/) and the CUDA kernels (kernels/cuda/): one
// definition of each formula, compiled for the host and, under nvcc, for the device. Inputs and
// outputs are FP32; storage conversions stay in each backend.
#pragma once

#include "host_device.h"

namespace multinorm::op_math {

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

// RMSNorm backward for one element, with xh = x * rstd and mean = mean_c(dout_c * w_c * xh_c):
//   dx = rstd * (dout * w - xh * mean)
MN_HOST_DEVICE float rmsnorm_dx(float dout, float w, float xh, float rstd, float mean) { return rstd * (dout * w - xh * mean); }

}  // namespace multinorm::op_math
