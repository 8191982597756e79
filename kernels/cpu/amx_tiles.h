// The AMX tile building blocks shared by the packed BF16 GEMM (matmul_packed.cpp) and blocked
// attention (attention.cpp). Include only from files compiled with -mamx-tile -mamx-bf16. The tile
// functions run only where amx_usable() (matmul_packed.h) says so; the packing (AVX-512 F and BW) also
// feeds the AVX512_BF16 block engine (dpbf16_block.h), which reads the same layouts.
//
// Tiles: C 0-3 (FP32 16 x 16 accumulators of a 32 x 32 output block), A 4-5 (16 rows x 32 BF16 of
// K), B 6-7 (16 K-pairs x 16 columns x 2). A 32 x 32 block costs 4 TDPBF16PS per 4 tile loads per 32
// of K (65,536 multiply-adds).
//
// "Packed B" layout of a K x N operand: [N/16][K/2][16][2], a panel of 16 columns after another,
// each holding K in pairs with a column's pair adjacent (the B tile's layout: 16 consecutive
// pair-rows of one panel form a tile). Element (k, n) sits at
//   (n / 16) * (K / 2) * 32 + (k / 2) * 32 + (n % 16) * 2 + k % 2.
#pragma once
#include <immintrin.h>

#include <cstdint>

namespace multinorm::cpu::amx {

constexpr int64_t kBlock = 32;  // output block edge (2 x 2 tiles)
constexpr int64_t kTileK = 32;  // BF16 elements of K per tile row (64 bytes)

struct TileConfig {
  uint8_t palette_id = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tile configuration is per-thread state: each thread of a parallel region loads its own before
// its first tile instruction and releases it at the end.
inline void configure_tiles() {
  TileConfig c;
  for (int t = 0; t < 8; ++t) c.rows[t] = 16, c.colsb[t] = 64;
  _tile_loadconfig(&c);
}
inline void release_tiles() { _tile_release(); }

// c[32 x 32] (FP32, row stride ldc floats) (+)= a[32 x K] b[K x 32], K a multiple of 32.
// a: BF16 rows, row stride lda elements. b: the first of two adjacent 16-column panels of a packed
// B, already offset to the block's first K pair; panel_stride = elements per panel (K_total / 2 * 32).
inline void block_32x32(float* c, int64_t ldc, bool accumulate, const uint16_t* a, int64_t lda, const uint16_t* b,
                        int64_t panel_stride, int64_t K) {
  const int64_t c_stride = ldc * 4, a_stride = lda * 2;
  if (accumulate) {
    _tile_loadd(0, c, c_stride);
    _tile_loadd(1, c + 16, c_stride);
    _tile_loadd(2, c + 16 * ldc, c_stride);
    _tile_loadd(3, c + 16 * ldc + 16, c_stride);
  } else {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  }
  const uint16_t* b1 = b + panel_stride;
  for (int64_t k0 = 0; k0 < K; k0 += kTileK) {
    _tile_loadd(4, a + k0, a_stride);
    _tile_loadd(5, a + 16 * lda + k0, a_stride);
    _tile_loadd(6, b + k0 * 16, 64);
    _tile_loadd(7, b1 + k0 * 16, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c, c_stride);
  _tile_stored(1, c + 16, c_stride);
  _tile_stored(2, c + 16 * ldc, c_stride);
  _tile_stored(3, c + 16 * ldc + 16, c_stride);
}

// The vector helpers of the packing: every CPU with AMX has AVX-512 (F, BW), so the packing
// functions that use them carry these targets instead of the whole file.
#define MULTINORM_AVX512_TARGET __attribute__((target("avx512f,avx512bw")))
// GCC 12 reports its own _mm512_undefined_* placeholders inside these intrinsics as uninitialised
// when they are inlined into a function with a target attribute (GCC bug 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// Two rows of 16 BF16 columns as 16 pairs (the low half from row0): the B tile's pair order.
MULTINORM_AVX512_TARGET inline __m512i interleave_rows(const uint16_t* row0, const uint16_t* row1) {
  const __m512i lo = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row0)));
  const __m512i hi = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row1)));
  return _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16));
}

// In-register transpose of a 16 x 16 matrix of 32-bit elements (r[i] = row i on entry, column i on
// exit): pairs of rows interleave by 32 and 64 bits (each 128-bit lane then holds a 4 x 4 block
// transposed), and two rounds of 128-bit lane shuffles put the blocks in place. 64 shuffles.
MULTINORM_AVX512_TARGET inline void transpose_16x16_epi32(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  __m512i u[16];  // u[4g + c], lane j: rows 4g..4g+3 of column 4j + c
  for (int g = 0; g < 4; ++g) {
    const __m512i* x = t + 4 * g;
    u[4 * g + 0] = _mm512_unpacklo_epi64(x[0], x[2]);
    u[4 * g + 1] = _mm512_unpackhi_epi64(x[0], x[2]);
    u[4 * g + 2] = _mm512_unpacklo_epi64(x[1], x[3]);
    u[4 * g + 3] = _mm512_unpackhi_epi64(x[1], x[3]);
  }
  for (int c = 0; c < 4; ++c) {
    const __m512i x = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x44), y = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x44);
    const __m512i z = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xEE), w = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xEE);
    r[c] = _mm512_shuffle_i32x4(x, y, 0x88);
    r[c + 4] = _mm512_shuffle_i32x4(x, y, 0xDD);
    r[c + 8] = _mm512_shuffle_i32x4(z, w, 0x88);
    r[c + 12] = _mm512_shuffle_i32x4(z, w, 0xDD);
  }
}

// dst rows m0..m0+15 (row stride ldd elements), columns k0..k0+31 <- the transpose of a[k0..k0+31]
// [m0..m0+15] (a row-major, row stride lda): a 32 x 16 block of BF16 turned into 16 tile rows.
MULTINORM_AVX512_TARGET inline void transpose_block_32x16(uint16_t* dst, int64_t ldd, const uint16_t* a, int64_t lda) {
  __m512i r[16];
  for (int p = 0; p < 16; ++p) r[p] = interleave_rows(a + (2 * p) * lda, a + (2 * p + 1) * lda);
  transpose_16x16_epi32(r);
  for (int m = 0; m < 16; ++m) _mm512_storeu_si512(dst + m * ldd, r[m]);
}

// One 16-column panel (columns nb*16 ..) of the packed B of a K x N operand b, zero padded to Kp
// and past column N. trans_b: b is stored [N, K] (row n holds column n's K values) with row stride
// ldb; else [K, N] with row stride ldb. Whole 32-row (or 32-column) blocks go through the vector
// helpers, the edges element by element.
MULTINORM_AVX512_TARGET inline void pack_b_panel(uint16_t* dst, const uint16_t* b, int64_t ldb, int64_t nb, int64_t N,
                                                 int64_t K, int64_t Kp, bool trans_b) {
  const int64_t n0 = nb * 16, cols = N - n0 < 16 ? N - n0 : 16;
  int64_t k0 = 0;
  if (cols == 16) {
    if (trans_b) {  // a pair-row of the panel is a 32-bit column of b's rows: 16 x 16 transposes
      for (; k0 + 32 <= K; k0 += 32) {
        __m512i r[16];
        for (int c = 0; c < 16; ++c) r[c] = _mm512_loadu_si512(b + (n0 + c) * ldb + k0);
        transpose_16x16_epi32(r);
        for (int p = 0; p < 16; ++p) _mm512_storeu_si512(dst + (k0 / 2 + p) * 32, r[p]);
      }
    } else {  // a pair-row is two rows of b interleaved
      for (; k0 + 2 <= K; k0 += 2)
        _mm512_storeu_si512(dst + (k0 / 2) * 32, interleave_rows(b + k0 * ldb + n0, b + (k0 + 1) * ldb + n0));
    }
  }
  for (int64_t k = k0; k < Kp; ++k) {
    uint16_t* d = dst + (k / 2) * 32 + (k & 1);
    int64_t c = 0;
    if (k < K) {
      if (trans_b)
        for (; c < cols; ++c) d[c * 2] = b[(n0 + c) * ldb + k];
      else
        for (; c < cols; ++c) d[c * 2] = b[k * ldb + n0 + c];
    }
    for (; c < 16; ++c) d[c * 2] = 0;
  }
}

#pragma GCC diagnostic pop

}  // namespace multinorm::cpu::amx
