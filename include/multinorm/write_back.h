// How an optimizer writes an FP32 update back to a stored weight: round to nearest even, or
// stochastic rounding from a counter-based hash of (seed, step, tensor, element) (the hash and the
// rounding itself: kernels/common/rounding.h, shared by every backend).
#pragma once
#include <cstdint>

namespace multinorm {

struct WriteBack {
  bool stochastic = false;
  uint64_t seed = 0, step = 0, tensor = 0;  // the stochastic-rounding counter
};

}  // namespace multinorm
