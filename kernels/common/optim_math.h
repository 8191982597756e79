// Per-element optimizer math shared by the CPU kernels and the CUDA kernels: one definition of the
// Adam step and of the scalars it uses (formed on the host from AdamArgs, identically for both).
#pragma once
#include <cmath>

#include "host_device.h"
#include "multinorm/backend.h"

namespace multinorm::optim_math {

// Adam/AdamW (torch semantics) for one element, with the scalars below:
//   g += l2_decay w;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   returns w (1 - lr decoupled_decay) - lr / (1 - b1^t) m / (sqrt(v) / sqrt(1 - b2^t) + eps)
struct AdamScalars {
  float b1, c1, b2, c2;           // beta1, 1 - beta1, beta2, 1 - beta2 (1 - beta formed in FP64, as torch)
  float step_size, inv_sqrt_bc2;  // lr / (1 - beta1^t), 1 / sqrt(1 - beta2^t)
  float eps, l2_decay, keep;      // keep = 1 - lr * decoupled_decay
};

inline AdamScalars adam_scalars(const AdamArgs& a) {
  AdamScalars s;
  const float bc1 = 1.0f - static_cast<float>(std::pow(a.beta1, static_cast<double>(a.step)));
  const float bc2 = 1.0f - static_cast<float>(std::pow(a.beta2, static_cast<double>(a.step)));
  s.step_size = a.lr / bc1, s.inv_sqrt_bc2 = 1.0f / std::sqrt(bc2);
  s.keep = 1.0f - a.lr * a.decoupled_decay;
  s.b1 = static_cast<float>(a.beta1), s.c1 = static_cast<float>(1.0 - a.beta1);
  s.b2 = static_cast<float>(a.beta2), s.c2 = static_cast<float>(1.0 - a.beta2);
  s.eps = a.eps, s.l2_decay = a.l2_decay;
  return s;
}

// Updates m and v in place and returns the new weight in FP32 (before the storage rounding).
MN_HOST_DEVICE float adam_element(float w, float g, float& m, float& v, const AdamScalars& a) {
  const float gi = g + a.l2_decay * w;
  m = a.b1 * m + a.c1 * gi;
  v = a.b2 * v + a.c2 * gi * gi;
  return w * a.keep - a.step_size * m / (sqrtf(v) * a.inv_sqrt_bc2 + a.eps);
}

}  // namespace multinorm::optim_math
