// BF16 storage on the CPU: the top 16 bits of an IEEE float. Conversions round to nearest even (the
// rounding cuBLAS, oneDNN and PyTorch use); NaN stays NaN. Compute is always FP32.
#pragma once
#include <cstdint>
#include <cstring>

namespace multinorm {

struct bf16 {
  uint16_t bits;
};

inline float to_f32(bf16 x) {
  const uint32_t u = static_cast<uint32_t>(x.bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}
inline float to_f32(float x) { return x; }

// Round to nearest even; NaN stays a (quiet) NaN. Written as a select, not a branch, so that loops
// of it vectorise (the kernels' BF16 stores).
inline bf16 to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (u >> 16) | 0x40u;
  return bf16{static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded)};
}

// b[i] <- a[i] + b[i] summed in FP32, rounded once to nearest even: the BF16 sum of the MPI
// reductions (the CPU backend's MPI communicator and the emulated NCCL).
inline void bf16_sum_into(const bf16* a, bf16* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) b[i] = to_bf16(to_f32(a[i]) + to_f32(b[i]));
}

// store<T>(value): the storage conversion for a kernel templated on its storage type.
template <class T>
inline T from_f32(float f);
template <>
inline float from_f32<float>(float f) {
  return f;
}
template <>
inline bf16 from_f32<bf16>(float f) {
  return to_bf16(f);
}

}  // namespace multinorm
