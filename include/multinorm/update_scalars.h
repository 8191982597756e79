// The scalars of one optimizer update that its kernels read from the backend's memory when they run,
// rather than from their launch arguments. Two reasons:
//   - the host need not see the gradient norm before it queues the update: the statistics op
//     (Backend::update_statistics) writes the norm, the clip factor and the skip flag on the device,
//     and the clipping and update kernels read them there;
//   - the update's launches are the same every update (the learning rate, Adam's bias corrections and
//     the stochastic-rounding step are data, not arguments), so one captured CUDA graph serves them all.
// The host writes the first part (Optimizer, one small copy before the update's ops); the statistics
// part is written by update_statistics: the norm, the clip factor, the update's loss, and whether
// the update is skipped (a non-finite loss or norm, or a loss over the spike threshold the host set
// from the losses it has seen: divergence.action skip). The host reads them one update later. On the CPU backend the struct is in host memory and its ops
// read it the same way. Plain data, shared by host and device code.
#pragma once
#include <cstdint>
#include <limits>

namespace multinorm {

// Adam/AdamW's scalars for one update (optim_math::adam_scalars forms them from AdamArgs).
struct AdamScalars {
  float b1, c1, b2, c2;           // beta1, 1 - beta1, beta2, 1 - beta2 (1 - beta formed in FP64, as torch)
  float step_size, inv_sqrt_bc2;  // lr / (1 - beta1^t), 1 / sqrt(1 - beta2^t)
  float eps, l2_decay, keep;      // keep = 1 - lr * decoupled_decay
};

// One rule's scalars for one update, formed on the host (optim_math::rule_scalars): the device does
// no arithmetic on them (nvcc would contract 1 - lr wd into an FMA: another rounding than the CPU's).
struct RuleScalars {
  float lr = 0, keep = 1;  // the learning rate; 1 - lr x decoupled weight decay
  float momentum = 0;      // SGD's
  AdamScalars adam{};      // Adam/AdamW at this update's t (the other rules leave it unused)
};

// The loss of an update's micro-batches, summed where they ran (Backend::accumulate_loss), as
// doubles: one FP64 all-reduce takes them over the ranks together with the gradient's squares.
struct LossTotals {
  double sum = 0;            // per-position losses over the counted positions
  double count = 0;          // counted positions
  double mean_sum = 0;       // micro-batch means, over the micro-batches with a counted position
  double micro_batches = 0;  // micro-batches with a counted position
};
constexpr int64_t kLossTotalsDoubles = sizeof(LossTotals) / sizeof(double);

// Why the statistics say skip (UpdateStatistics::skip_reason).
enum SkipReason : uint32_t { kNotSkipped = 0, kNonFiniteLoss = 1, kNonFiniteNorm = 2, kLossSpike = 3 };

// SWAN's Newton-Schulz over one update's tensors, added by its ops where they run (the device on a
// GPU: convergence and the exact fallback are decided there, swan.cu): Newton-Schulz is never
// accepted silently. The residual is ||I - Z Y||_F / sqrt(k) of the final iterate (0 on the exact path).
struct SwanStats {
  double worst_residual = 0;  // over the tensors that took Newton-Schulz's result
  uint32_t tensors = 0;
  uint32_t unconverged = 0;     // residual at or above ns_tolerance after ns_steps (tolerance > 0)
  uint32_t fallbacks = 0;       // non-finite iterations replaced by the exact path
  uint32_t steps = 0;           // the most Newton-Schulz iterations one tensor applied
  uint32_t exact_failures = 0;  // tensors whose exact path failed (LAPACK): not updated, the run stops
  uint32_t reserved = 0;
};

// What the statistics op computes on the device for one update (optim_math::finish_statistics).
struct UpdateStatistics {
  double grad_norm = 0;     // sqrt of the per-tensor FP64 sums of squares, added in tensor order
  double loss = 0;          // token mean, or the mean of micro-batch means, over every rank
  double tokens = 0;        // counted positions, over every rank
  float clip_factor = 1;    // grad_clip / grad_norm when the norm exceeds grad_clip (> 0), else 1
  uint32_t skip = 0;        // 1: the update's kernels change nothing
  uint32_t skip_reason = kNotSkipped;
  uint32_t clipped = 0;     // 1: clip_factor < 1 was applied
  uint32_t spike = 0;       // 1: the loss exceeded UpdateScalars::spike_threshold
  uint32_t reserved = 0;
  SwanStats swan;           // zero here; SWAN's ops add theirs after
};

// Rule slots of one update: one per (rule, learning-rate group) of the optimizer (the paper's: the
// matrix rule at lr x alpha, and Adam at lr).
constexpr int kUpdateRuleSlots = 4;

struct UpdateScalars {
  // ---- written by the host before the update's ops ----
  RuleScalars rule[kUpdateRuleSlots];
  uint64_t update = 0;  // the update number: stochastic rounding's step
  double spike_threshold = std::numeric_limits<double>::infinity();  // a loss above it is a spike (+inf: none)
  uint32_t skip_spikes = 0;    // 1: a spike skips the update (divergence.action skip)
  uint32_t token_mean = 0;     // 1: the loss is the token mean; 0: the mean of micro-batch means
  // ---- written by the statistics op (update_statistics) ----
  UpdateStatistics stats;
};

// Where an optimizer op finds its update's scalars: `at` (backend memory) and its rule's slot. With
// at == nullptr the op uses its own arguments (lr, step, write.step) and skips nothing.
struct ScalarsRef {
  const UpdateScalars* at = nullptr;
  int slot = 0;
};

}  // namespace multinorm
