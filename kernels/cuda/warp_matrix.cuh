// The warp-level matrix primitives of sm_80+ tensor cores, the one place inline PTX is allowed
// (tests/lint_cuda.sh): mma.sync m16n8k16 with BF16 operands and FP32 accumulators, ldmatrix, and
// the asynchronous global-to-shared copies (cp.async) that feed their tiles.
// Under nvcc each is one PTX instruction. In the emulated build each is a warp collective
// (cuda_emu::warp_exchange: every lane's registers gathered) that follows the PTX ISA's fragment
// layouts exactly, so an emulated kernel puts every element in the lane the GPU would, and a kernel
// that reads a fragment wrongly computes a wrong result here too (tests/test_warp_matrix.cpp checks
// every lane against a plain matrix product).
//
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type"). Lane l,
// g = l / 4 (its group), t = l % 4 (its place in the group). A 32-bit register holds two BF16, the
// lower column (or row) index in its low 16 bits.
//   A 16x16 (row, k), 4 registers:  a[0] = A[g][2t, 2t+1]     a[1] = A[g+8][2t, 2t+1]
//                                   a[2] = A[g][2t+8, 2t+9]   a[3] = A[g+8][2t+8, 2t+9]
//   B 16x8 (k, col), 2 registers:   b[0] = B[2t, 2t+1][g]     b[1] = B[2t+8, 2t+9][g]
//   C, D 16x8 FP32, 4 floats:       c[0], c[1] = C[g][2t, 2t+1]     c[2], c[3] = C[g+8][2t, 2t+1]
// So the accumulators of two neighbouring 16x8 tiles (columns 0-7 and 8-15), rounded to BF16 and
// packed in pairs, are exactly the A fragment of a 16x16 tile: attention's P and dS go from one
// mma's output to the next one's input without touching shared memory.
//
// ldmatrix .x4 loads four 8x8 BF16 matrices from shared memory: lanes 8i .. 8i+7 give the addresses
// of matrix i's rows 0..7 (16 bytes each, 16-byte aligned); lane l receives
//   r[i] = M_i[g][2t, 2t+1]                      (plain)
//   r[i] = M_i[2t][g], M_i[2t+1][g]              (.trans: the transpose's row g)
// With rows of a row-major [rows][k] tile it yields the A fragment (matrices: rows 0-7 / 8-15 x
// k 0-7 / 8-15) or, with rows of a row-major [n][k] tile, B fragments of B = tile^T; .trans over a
// row-major [k][n] tile yields B fragments of B = tile.
#pragma once
#include <cstdint>

#include "cuda_compat.h"

#if MN_EMULATED
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#endif

namespace multinorm::cuda {

// Two floats rounded to BF16 (nearest even) in one register, `lo` in the low half.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
#if MN_EMULATED
  const bf16 l = __float2bfloat16(lo), h = __float2bfloat16(hi);
  uint16_t lb, hb;
  std::memcpy(&lb, &l, 2);
  std::memcpy(&hb, &h, 2);
  return uint32_t(lb) | uint32_t(hb) << 16;
#else
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
#endif
}

#if MN_EMULATED
namespace warp_matrix_emulation {
inline int lane_id() { return static_cast<int>((threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)) % 32); }
inline float bf16_half(uint32_t reg, int half) {
  const uint32_t bits = (half ? reg & 0xffff0000u : reg << 16);
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
struct MmaOperands {
  uint32_t a[4], b[2];
};
// A[row][k] and B[k][col] of the warp's operands, from the gathered fragments (the layouts above).
inline float a_at(const MmaOperands* all, int row, int k) {
  return bf16_half(all[(row % 8) * 4 + (k % 8) / 2].a[(row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0)], k & 1);
}
inline float b_at(const MmaOperands* all, int k, int col) { return bf16_half(all[col * 4 + (k % 8) / 2].b[k >= 8 ? 1 : 0], k & 1); }

template <int N>
void ldmatrix(uint32_t (&r)[N], const void* row_address, bool trans) {
  const int lane = lane_id();
  if (lane < 8 * N) {
    if (reinterpret_cast<uintptr_t>(row_address) % 16)
      throw std::runtime_error("ldmatrix: lane " + std::to_string(lane) + " passes a row address not 16-byte aligned (a GPU stops the kernel)");
    if (!::cuda_emu::is_shared_address(row_address, 16))
      throw std::runtime_error("ldmatrix: lane " + std::to_string(lane) + " passes a row address outside shared memory (a GPU stops the kernel)");
  }
  const auto* rows = static_cast<const uint16_t* const*>(::cuda_emu::warp_exchange(0xffffffffu, &row_address, sizeof(row_address)));
  const int g = lane / 4, t = lane % 4;
  for (int i = 0; i < N; ++i) {
    const uint16_t* const* m = rows + 8 * i;  // matrix i's row addresses
    const uint16_t lo = trans ? m[2 * t][g] : m[g][2 * t];
    const uint16_t hi = trans ? m[2 * t + 1][g] : m[g][2 * t + 1];
    r[i] = uint32_t(lo) | uint32_t(hi) << 16;
  }
}
}  // namespace warp_matrix_emulation
#endif

// d += A B for one 16x16x16 tile per warp (BF16 in, FP32 accumulate); every lane of the warp calls it.
// The emulation sums the 16 exact products in double and adds them to d once: a tensor core's
// internal order and precision are not specified, so the tests compare by tolerance.
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if MN_EMULATED
  using namespace warp_matrix_emulation;
  const MmaOperands mine{{a[0], a[1], a[2], a[3]}, {b[0], b[1]}};
  const auto* all = static_cast<const MmaOperands*>(::cuda_emu::warp_exchange(0xffffffffu, &mine, sizeof(mine)));
  const int lane = lane_id(), g = lane / 4, t = lane % 4;
  for (int i = 0; i < 4; ++i) {
    const int row = g + (i >= 2 ? 8 : 0), col = 2 * t + (i & 1);
    double s = 0.0;
    for (int k = 0; k < 16; ++k) s += double(a_at(all, row, k)) * double(b_at(all, k, col));
    d[i] = static_cast<float>(double(d[i]) + s);
  }
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

// cp.async.cg: 16 bytes from global memory to shared memory without passing through registers;
// `valid` false zero-fills the 16 bytes (src-size 0) and reads nothing. A copy lands only when a
// cp_async_wait lets its group complete: commit after issuing a tile's copies, wait with the number
// of newer groups that may stay in flight, then __syncthreads before other threads read the tile.
// The emulation keeps each thread's groups and lands them at the wait (cuda_emulation.h).
__device__ __forceinline__ void cp_async_16(void* shared_dst, const void* global_src, bool valid) {
#if MN_EMULATED
  ::cuda_emu::async_copy(shared_dst, global_src, valid ? 16 : 0);
#else
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(shared_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(global_src), "r"(valid ? 16 : 0) : "memory");
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if MN_EMULATED
  ::cuda_emu::async_commit();
#else
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}
// Waits until at most `kPending` of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
#if MN_EMULATED
  ::cuda_emu::async_wait(kPending);
#else
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
#endif
}

// 2^x on the special-function unit (ex2.approx, what __expf runs after scaling by log2 e; 2^-inf =
// 0): attention's exponentials with the softmax scale and log2 e folded into one FMA.
__device__ __forceinline__ float fast_exp2(float x) {
#if MN_EMULATED
  return std::exp2(x);
#else
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
#endif
}

// Four 8x8 BF16 matrices from shared memory (lanes 8i..8i+7: matrix i's row addresses).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row_address) {
#if MN_EMULATED
  warp_matrix_emulation::ldmatrix(r, row_address, false);
#else
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(row_address));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n" : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
#endif
}

// The same, each matrix transposed.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row_address) {
#if MN_EMULATED
  warp_matrix_emulation::ldmatrix(r, row_address, true);
#else
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(row_address));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n" : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
#endif
}

}  // namespace multinorm::cuda
