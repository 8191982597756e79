// A micro-batch as the data layer hands it to the model: views of host arrays, no ownership.
#pragma once
#include <cstdint>

namespace multinorm {

// One micro-batch on the host: B sequences of T tokens, row-major [B, T]. targets[b, t] is the token
// to predict at position t (the caller shifts); loss_mask[b, t] = 0 excludes the position (padding);
// a null loss_mask counts every position.
struct MicroBatch {
  const int32_t* tokens = nullptr;
  const int32_t* targets = nullptr;
  const uint8_t* loss_mask = nullptr;
  int64_t B = 0, T = 0;
  int64_t count_targets() const;  // positions that count in the loss
};

}  // namespace multinorm
