// Optimizer math shared by the CPU kernels and the CUDA kernels: one definition of the Adam step and
// of the scalars it uses (formed on the host from AdamArgs, identically for both), of every rule's
// per-update scalars, and of an update's statistics (norm, clip factor, loss, skip flag) from its
// per-tensor sums of squares and its loss totals.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#include "host_device.h"
#include "multinorm/optimizer_kernels.h"

namespace multinorm::optim_math {

// Adam/AdamW (torch semantics) for one element, with the scalars below:
//   g += l2_decay w;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   returns w (1 - lr decoupled_decay) - lr / (1 - b1^t) m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// (AdamScalars: include/multinorm/update_scalars.h)
using multinorm::AdamScalars;

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

// A rule's scalars for one update (UpdateScalars::rule): the learning rate and 1 - lr wd, formed here
// on the host for every backend; Adam's add its step's scalars.
inline RuleScalars rule_scalars(float lr, float decoupled_decay) {
  RuleScalars r;
  r.lr = lr;
  r.keep = 1.0f - lr * decoupled_decay;
  return r;
}
inline RuleScalars rule_scalars(const AdamArgs& a) {
  RuleScalars r = rule_scalars(a.lr, a.decoupled_decay);
  r.adam = adam_scalars(a);
  return r;
}
inline RuleScalars rule_scalars(const SgdArgs& a) {
  RuleScalars r = rule_scalars(a.lr, a.decoupled_decay);
  r.momentum = a.momentum;
  return r;
}

// An update's statistics from the per-tensor FP64 sums of squares, added in tensor order (the same
// number on every backend and rank layout: a rank that does not hold a tensor adds its zero), and
// from its loss totals (over every rank). Run by one device thread (CUDA) or the host.
MN_HOST_DEVICE bool finite_double(double x) { return x <= 1.7976931348623157e308 && x >= -1.7976931348623157e308; }
MN_HOST_DEVICE UpdateStatistics finish_statistics(const double* squares, int64_t count, const LossTotals& loss,
                                                         const UpdateScalars& rules, double grad_clip) {
  double sum = 0;
  for (int64_t i = 0; i < count; ++i) sum += squares[i];
  UpdateStatistics s;
  s.grad_norm = sqrt(sum);
  s.tokens = loss.count;
  s.loss = rules.token_mean ? loss.sum / (loss.count > 1 ? loss.count : 1.0)
                            : loss.mean_sum / (loss.micro_batches > 1 ? loss.micro_batches : 1.0);
  s.spike = finite_double(s.loss) && s.loss > rules.spike_threshold;
  s.skip_reason = !finite_double(s.loss) ? kNonFiniteLoss
                  : !finite_double(s.grad_norm) ? kNonFiniteNorm
                  : (s.spike && rules.skip_spikes) ? kLossSpike
                  : kNotSkipped;
  s.skip = s.skip_reason != kNotSkipped;
  s.clipped = !s.skip && grad_clip > 0 && s.grad_norm > grad_clip;
  s.clip_factor = s.clipped ? static_cast<float>(grad_clip / s.grad_norm) : 1.0f;
  return s;
}

// SWAN's Newton-Schulz step, scaled (Chen & Chow, 2014). The square roots x of the eigenvalues of
// P = Z Y start in [lower, 1] (Y0 = A / c, c an upper bound of A's largest eigenvalue; lower =
// sqrt(regularisation / c)), and a step maps each by x -> alpha x (3 - alpha^2 x^2) / 2, which is
// T = (3 alpha / 2) I - (alpha^3 / 2) P. alpha = sqrt(3 / (1 + l + l^2)) sends l and 1 to the same
// value, so every x stays in [new lower, 1] and none changes sign: the lower bound grows up to 2.6x a
// step where the plain iteration (alpha = 1) grows it 1.5x, and alpha -> 1 as it nears 1 (the plain
// iteration's quadratic end). Formed in FP64 the same way by both backends.
struct NsStep {
  double identity, product;  // T = identity I - product P
  double next_lower;         // the lower bound after the step
};
MN_HOST_DEVICE NsStep ns_step(double lower) {
  const double l = lower < 1.0 ? lower : 1.0;
  const double alpha = sqrt(3.0 / (1.0 + l + l * l));
  return {1.5 * alpha, 0.5 * alpha * alpha * alpha, alpha * l * (3.0 - alpha * alpha * l * l) / 2.0};
}

// A float rounded to TF32 (10 explicit mantissa bits; to nearest, ties away from zero, as PTX's
// cvt.rna.tf32.f32), kept in an FP32 word; inf and NaN stay as they are.
MN_HOST_DEVICE float tf32_round(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof(u));
  if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x1000u) & 0xffffe000u;
  memcpy(&x, &u, sizeof(u));
  return x;
}
// x as hi + lo, both exactly TF32 (split TF32 products: hi·hi + hi·lo + lo·hi): hi is x rounded,
// lo the rest (exact in FP32) rounded, so |x - hi - lo| <= 2^-22 |x| whatever a tensor core does to
// an FP32 operand's low bits (they are zero here).
struct Tf32Split {
  float hi, lo;
};
MN_HOST_DEVICE Tf32Split split_tf32(float x) {
  const float hi = tf32_round(x);
  return {hi, tf32_round(x - hi)};
}

// The steps after which that bound puts every eigenvalue of P within `tolerance` of 1 (the residual
// ||I - P||_F / sqrt(k) is at most 1 - lower^2), from the lowest start there is: lower^2 = the
// regularisation 1e-6 ||A||_F over c <= ||A||_F, so lower >= 1e-3. In exact arithmetic no matrix
// needs more (10 at a tolerance of 1e-4; the plain iteration needs ~20 from the same start).
inline int ns_steps_bound(double tolerance) {
  double lower = 1e-3;
  int steps = 0;
  while (1.0 - lower * lower >= tolerance && steps < 1000) lower = ns_step(lower).next_lower, ++steps;
  return steps;
}

// One SWAN tensor into the update's statistics: its final residual (NaN when Newton-Schulz diverged
// and the exact path replaced it: fell_back), the iterations it applied, and the tolerance it was held
// to (0: none, or the exact path). Run by one device thread (CUDA) or the host, tensor by tensor.
MN_HOST_DEVICE void add_swan_tensor(SwanStats& s, double residual, bool fell_back, int steps, float tolerance) {
  s.tensors += 1;
  if (fell_back) {
    s.fallbacks += 1;
  } else {
    s.worst_residual = residual > s.worst_residual ? residual : s.worst_residual;
    if (tolerance > 0 && !(residual < tolerance)) s.unconverged += 1;
  }
  s.steps = static_cast<uint32_t>(steps) > s.steps ? static_cast<uint32_t>(steps) : s.steps;
}

// One micro-batch's losses into the update's totals: the FP64 sum over the counted positions in one
// fixed order for every backend (lane j of kLossLanes adds positions j, j + kLossLanes, ... in
// order, then the lanes are added in lane order: a GPU block of kLossLanes threads runs it as
// written), its count and its mean.
constexpr int kLossLanes = 256;
MN_HOST_DEVICE void add_micro_batch_loss(LossTotals& t, double sum, int64_t count) {
  if (count == 0) return;
  t.sum += sum;
  t.count += static_cast<double>(count);
  t.mean_sum += sum / static_cast<double>(count);
  t.micro_batches += 1;
}

// Updates m and v in place and returns the new weight in FP32 (before the storage rounding).
MN_HOST_DEVICE float adam_element(float w, float g, float& m, float& v, const AdamScalars& a) {
  const float gi = g + a.l2_decay * w;
  m = a.b1 * m + a.c1 * gi;
  v = a.b2 * v + a.c2 * gi * gi;
  return w * a.keep - a.step_size * m / (sqrtf(v) * a.inv_sqrt_bc2 + a.eps);
}

}  // namespace multinorm::optim_math
