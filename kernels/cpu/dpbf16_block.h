// A 32 x 32 BF16 block product on AVX512_BF16's VDPBF16PS, for CPUs without AMX tiles (AMD Zen 4
// and later, Intel Cooper Lake). It takes exactly amx::block_32x32's operands (amx_tiles.h): a as
// BF16 rows, b as the packed ("VNNI") B, whose 32 bytes of one K pair for 16 columns are one vector
// operand of VDPBF16PS. A kernel therefore swaps one engine for the other without repacking.
//
// One VDPBF16PS adds a K pair's products to 16 FP32 columns: 32 multiply-adds, twice an FP32 FMA's.
// Rows go 8 at a time: 16 accumulators (8 rows x 2 panels) stay in registers while K streams; per K
// pair, 2 vector loads of b and 8 broadcast loads of a feed 16 VDPBF16PS. A 32 x 32 x K block is
// 2 x 32 x 32 x K FLOPs over 64 K bytes of a and 64 K bytes of b (each read 4 times, from L1).
//
// Include only where amx_tiles.h may be included (its packing is used with it); the functions carry
// their own target, and run only where avx512_bf16_usable() says so.
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace multinorm::cpu::dpbf16 {

#define MULTINORM_AVX512_BF16_TARGET __attribute__((target("avx512f,avx512bf16")))

// c[32 x 32] (FP32, row stride ldc floats) (+)= a[32 x K] b[K x 32], K even. a: BF16 rows, row stride
// lda elements. b: the first of two adjacent 16-column panels of a packed B, already offset to the
// block's first K pair; panel_stride = elements per panel.
MULTINORM_AVX512_BF16_TARGET inline void block_32x32(float* c, int64_t ldc, bool accumulate, const uint16_t* a,
                                                     int64_t lda, const uint16_t* b, int64_t panel_stride, int64_t K) {
  const uint16_t* b1 = b + panel_stride;
  for (int64_t r0 = 0; r0 < 32; r0 += 8) {
    __m512 acc[8][2];
    for (int r = 0; r < 8; ++r) {
      float* cr = c + (r0 + r) * ldc;
      acc[r][0] = accumulate ? _mm512_loadu_ps(cr) : _mm512_setzero_ps();
      acc[r][1] = accumulate ? _mm512_loadu_ps(cr + 16) : _mm512_setzero_ps();
    }
    const uint16_t* ar = a + r0 * lda;
    for (int64_t k = 0; k < K; k += 2) {
      const __m512bh b0v = reinterpret_cast<__m512bh>(_mm512_loadu_si512(b + k * 16));
      const __m512bh b1v = reinterpret_cast<__m512bh>(_mm512_loadu_si512(b1 + k * 16));
      for (int r = 0; r < 8; ++r) {
        int32_t pair;  // a[r][k], a[r][k + 1] as one 32-bit lane
        std::memcpy(&pair, ar + r * lda + k, sizeof(pair));
        const __m512bh av = reinterpret_cast<__m512bh>(_mm512_set1_epi32(pair));
        acc[r][0] = _mm512_dpbf16_ps(acc[r][0], av, b0v);
        acc[r][1] = _mm512_dpbf16_ps(acc[r][1], av, b1v);
      }
    }
    for (int r = 0; r < 8; ++r) {
      float* cr = c + (r0 + r) * ldc;
      _mm512_storeu_ps(cr, acc[r][0]);
      _mm512_storeu_ps(cr + 16, acc[r][1]);
    }
  }
}

}  // namespace multinorm::cpu::dpbf16
