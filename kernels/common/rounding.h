// Writing an FP32 update back to a stored weight. BF16 weights round to nearest even, or
// stochastically: a uniform 16-bit draw is added below the kept bits before truncation, so the
// expected stored value equals the FP32 value (unbiased). The draw is a counter-based hash of
// (seed, step, tensor, element): identical on every run, resume and thread layout.
#pragma once
#include <cstdint>

#include "bf16.h"
#include "host_device.h"
#include "multinorm/write_back.h"

namespace multinorm {

// Compiled for the host and, under nvcc, for the device: both backends draw the same numbers.
MN_HOST_DEVICE uint32_t rounding_hash(uint64_t seed, uint64_t step, uint64_t tensor, uint64_t index) {
  uint64_t x = seed * 0x9e3779b97f4a7c15ULL ^ (step + 0x632be59bd9b4e019ULL) * 0xbf58476d1ce4e5b9ULL ^
               (tensor + 1) * 0x94d049bb133111ebULL ^ index;
  x ^= x >> 31;
  x *= 0x7fb5d329728ea185ULL;
  x ^= x >> 27;
  x *= 0x81dadef4bc2dd44dULL;
  x ^= x >> 33;
  return static_cast<uint32_t>(x);
}

// FP32 bits rounded stochastically to BF16 bits: the 16-bit draw added below the kept bits, then
// truncation. Inf and NaN must take the nearest-even path instead (is_inf_or_nan).
MN_HOST_DEVICE uint16_t stochastic_bf16_bits(uint32_t bits, uint32_t draw) { return static_cast<uint16_t>((bits + (draw & 0xffffu)) >> 16); }
MN_HOST_DEVICE bool is_inf_or_nan(uint32_t bits) { return (bits & 0x7f800000u) == 0x7f800000u; }

template <class T>
inline T write_weight(float value, const WriteBack& wb, uint64_t index);

template <>
inline float write_weight<float>(float value, const WriteBack&, uint64_t) {
  return value;
}

template <>
inline bf16 write_weight<bf16>(float value, const WriteBack& wb, uint64_t index) {
  if (!wb.stochastic) return to_bf16(value);
  const uint32_t bits = __builtin_bit_cast(uint32_t, value);
  if (is_inf_or_nan(bits)) return to_bf16(value);  // inf and NaN stay as they are
  return bf16{stochastic_bf16_bits(bits, rounding_hash(wb.seed, wb.step, wb.tensor, index))};
}

}  // namespace multinorm
