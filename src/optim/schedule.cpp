#include "multinorm/schedule.h"

#include <algorithm>
#include <cmath>

namespace multinorm {

double schedule_multiplier(const ScheduleConfig& s, int64_t update) {
  const double step = static_cast<double>(s.galore_offset ? update - 1 : update);
  const double warmup = static_cast<double>(s.warmup_steps), total = static_cast<double>(s.total_steps);
  if (step < warmup) return std::max(0.0, step / warmup);
  if (s.kind == ScheduleKind::Constant) return 1.0;
  const double p = total > warmup ? std::clamp((step - warmup) / (total - warmup), 0.0, 1.0) : 1.0;
  const double r = s.min_lr_ratio;
  if (s.kind == ScheduleKind::Linear) return r + (1.0 - r) * (1.0 - p);
  return r + (1.0 - r) * 0.5 * (1.0 + std::cos(M_PI * p));
}

}  // namespace multinorm
