// Device helpers shared by the CUDA kernels: storage conversions, 16-byte packs, warp and block
// reductions. Included by kernel files only (through cuda_compat.h's world: nvcc or the emulation).
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "../common/host_device.h"
#include "../common/rounding.h"
#include "cuda_compat.h"
#include "multinorm/update_scalars.h"

namespace multinorm::cuda {

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(bf16 x) { return __bfloat162float(x); }
template <class T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ bf16 from_float<bf16>(float x) {
  return __float2bfloat16(x);  // round to nearest even, as the CPU backend
}

// An FP32 update written back to a stored weight, with the CPU backend's rounding decisions
// (kernels/common/rounding.h): nearest even, or stochastic from the same counter-based hash.
template <class T>
__device__ __forceinline__ T store_weight(float value, const WriteBack& wb, uint64_t index);
template <>
__device__ __forceinline__ float store_weight<float>(float value, const WriteBack&, uint64_t) {
  return value;
}
template <>
__device__ __forceinline__ bf16 store_weight<bf16>(float value, const WriteBack& wb, uint64_t index) {
  uint32_t bits;
  memcpy(&bits, &value, sizeof(bits));
  if (!wb.stochastic || is_inf_or_nan(bits)) return __float2bfloat16(value);
  __nv_bfloat16_raw raw;
  raw.x = stochastic_bf16_bits(bits, rounding_hash(wb.seed, wb.step, wb.tensor, index));
  return bf16(raw);
}

// An optimizer kernel's per-update scalars: with s (device memory) set, its rule's slot and the
// update's stochastic-rounding step, read when the kernel runs (the launch arguments r and wb.step
// stand otherwise). False when the update's statistics say skip: the kernel then writes nothing.
__device__ __forceinline__ bool take_update_scalars(const UpdateScalars* s, int slot, RuleScalars& r, WriteBack& wb) {
  if (!s) return true;
  if (s->stats.skip) return false;
  r = s->rule[slot];
  wb.step = s->update;
  return true;
}

#if defined(MULTINORM_EMU_RACECHECK) && !defined(__CUDACC__)
extern "C" void __tsan_read16(void*);   // racecheck's hooks (emulation/racecheck.cpp)
extern "C" void __tsan_write16(void*);
#endif

// 16 bytes of T: one vectorised load/store (LDG.128 / STG.128) on the GPU.
template <class T>
struct alignas(16) Pack {
  static constexpr int kSize = 16 / sizeof(T);
  T v[kSize];
#if defined(MULTINORM_EMU_RACECHECK) && !defined(__CUDACC__)
  // g++ may split a pack's copy into element accesses (it keeps only the values used), which pass
  // racecheck's alignment check where the GPU's 16-byte access faults (cudaErrorMisalignedAddress):
  // a pack read from or written to memory (the source of a copy or an assignment, the destination
  // of an assignment) is checked here as the one 16-byte access it is there.
  Pack() = default;
  Pack(const Pack& o) {
    __tsan_read16(const_cast<Pack*>(&o));
    for (int k = 0; k < kSize; ++k) v[k] = o.v[k];
  }
  Pack& operator=(const Pack& o) {
    __tsan_read16(const_cast<Pack*>(&o));
    __tsan_write16(this);
    for (int k = 0; k < kSize; ++k) v[k] = o.v[k];
    return *this;
  }
#endif
};
// Whether p may take a 16-byte pack path (launchers and kernels alike).
MN_HOST_DEVICE bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
// Whether rows of `width` elements starting at p can be read as packs (base aligned, width a
// multiple of the pack).
template <class T>
__device__ __forceinline__ bool packable(const void* p, int64_t width) {
  return (reinterpret_cast<uintptr_t>(p) % 16 == 0) && width % Pack<T>::kSize == 0;
}

// P values from x + j as FP32: 16-byte packs (P a multiple of Pack<X>::kSize) or one element (P = 1).
template <class X, int P>
__device__ __forceinline__ void load_values(const X* x, int64_t j, float (&out)[P]) {
  if constexpr (P == 1) {
    out[0] = to_float(x[j]);
  } else {
    constexpr int S = Pack<X>::kSize;
    static_assert(P % S == 0, "whole packs");
#pragma unroll
    for (int q = 0; q < P; q += S) {
      const Pack<X> pk = *reinterpret_cast<const Pack<X>*>(x + j + q);
#pragma unroll
      for (int p = 0; p < S; ++p) out[q + p] = to_float(pk.v[p]);
    }
  }
}

// P values of X to x + j: 16-byte packs (P a multiple of the pack) or one element (P = 1).
template <class X, int P>
__device__ __forceinline__ void store_packs(X* x, int64_t j, const X (&in)[P]) {
  if constexpr (P == 1) {
    x[j] = in[0];
  } else {
    constexpr int S = Pack<X>::kSize;
    static_assert(P % S == 0, "whole packs");
#pragma unroll
    for (int q = 0; q < P; q += S) {
      Pack<X> pk;
#pragma unroll
      for (int p = 0; p < S; ++p) pk.v[p] = in[q + p];
      *reinterpret_cast<Pack<X>*>(x + j + q) = pk;
    }
  }
}

// P values to x + at: as 16-byte packs where `packed` (the caller's row starts on 16 bytes and its
// stride holds the whole pack), else the first `valid` of them (a row's end) one by one.
template <class X, int P>
__device__ __forceinline__ void store_row_values(X* x, int64_t at, int64_t valid, bool packed, const X (&in)[P]) {
  if (packed) {
    store_packs<X, P>(x, at, in);
    return;
  }
#pragma unroll
  for (int p = 0; p < P; ++p)
    if (p < valid) x[at + p] = in[p];
}

// Sum over the warp (float or double), every lane gets the result.
template <class F>
__device__ __forceinline__ F warp_sum(F v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
// Sum over the block (blockDim.x a multiple of 32, at most 1024), float or double; every thread gets
// the result. `scratch` is 32 elements of shared memory; the call begins with a barrier, so it can
// be used back to back.
template <class F>
__device__ __forceinline__ F block_sum(F v, F* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  F t = lane < warps ? scratch[lane] : F(0);
  return warp_sum(t);
}

}  // namespace multinorm::cuda
