// The learning-rate multiplier of optimizer update k (k = 1 .. total_steps):
//   mult(s) = s / warmup                                   for s < warmup
//   mult(s) = r + (1 - r) (1 + cos(pi p)) / 2   (cosine)   p = (s - warmup) / (total - warmup)
//           = r + (1 - r) (1 - p)               (linear)   r = min_lr_ratio
//           = 1                                 (constant)
// Update k uses mult(k): the first update runs at lr / warmup, update `warmup` at the peak, the last
// at r x peak. With galore_offset, update k uses mult(k - 1) as GaLore's code does (its first update
// runs at lr 0).
#pragma once
#include <cstdint>

#include "multinorm/run_config.h"

namespace multinorm {

double schedule_multiplier(const ScheduleConfig& s, int64_t update);

}  // namespace multinorm
