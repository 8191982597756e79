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

inline bf16 to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<uint16_t>((u >> 16) | 0x40u)};  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{static_cast<uint16_t>(u >> 16)};
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
