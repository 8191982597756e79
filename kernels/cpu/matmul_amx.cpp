#include "matmul_amx.h"

#include <cpuid.h>
#include <immintrin.h>
#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "../common/bf16.h"

namespace multinorm::cpu {

namespace {

// Tiles: C 0-3 (FP32 16x16 accumulators of a 32x32 output block), A 4-5 (16 rows x 32 K), B 6-7
// (16 K-pairs x 16 columns x 2). A 32x32 block costs 4 TDPBF16PS per 4 tile loads per 32 K.
constexpr int64_t kBlock = 32;  // output block edge (2 x 2 tiles)
constexpr int64_t kTileK = 32;  // BF16 elements of K per tile row (64 bytes)

struct TileConfig {
  uint8_t palette_id = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tile configuration is per thread state: each thread of the parallel region loads its own.
void configure_tiles() {
  TileConfig c;
  for (int t = 0; t < 8; ++t) c.rows[t] = 16, c.colsb[t] = 64;
  _tile_loadconfig(&c);
}

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// b as [Np/16][Kp/2][16][2]: for each 16-column block, K in pairs, each column's pair adjacent (the
// B tile's layout: a tile is 16 consecutive pairs-rows of one column block). Zero padded.
void pack_b(uint16_t* bp, const uint16_t* b, int64_t N, int64_t K, int64_t Np, int64_t Kp, bool trans_b) {
#pragma omp parallel for schedule(static)
  for (int64_t nb = 0; nb < Np / 16; ++nb) {
    uint16_t* dst = bp + nb * Kp * 16;
    for (int64_t c = 0; c < 16; ++c) {
      const int64_t n = nb * 16 + c;
      if (n >= N) {
        for (int64_t kp = 0; kp < Kp / 2; ++kp) dst[kp * 32 + c * 2] = dst[kp * 32 + c * 2 + 1] = 0;
        continue;
      }
      if (trans_b) {  // b is [N, K]: row n holds the column's K consecutively
        const uint16_t* row = b + n * K;
        for (int64_t k = 0; k < Kp; ++k) dst[(k / 2) * 32 + c * 2 + (k & 1)] = k < K ? row[k] : 0;
      } else {  // b is [K, N]
        for (int64_t k = 0; k < Kp; ++k) dst[(k / 2) * 32 + c * 2 + (k & 1)] = k < K ? b[k * N + n] : 0;
      }
    }
  }
}

// a as [Mp][Kp] rows, zero padded (transposed from [K, M] when trans_a).
void pack_a(uint16_t* ap, const uint16_t* a, int64_t M, int64_t K, int64_t Mp, int64_t Kp, bool trans_a) {
  if (!trans_a) {
#pragma omp parallel for schedule(static)
    for (int64_t m = 0; m < Mp; ++m) {
      uint16_t* dst = ap + m * Kp;
      if (m < M) {
        std::memcpy(dst, a + m * K, K * sizeof(uint16_t));
        std::fill(dst + K, dst + Kp, 0);
      } else {
        std::fill(dst, dst + Kp, 0);
      }
    }
    return;
  }
  // Transpose in 64 x 64 blocks (both sides stay in L1).
  constexpr int64_t kT = 64;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t m0 = 0; m0 < Mp; m0 += kT)
    for (int64_t k0 = 0; k0 < Kp; k0 += kT)
      for (int64_t m = m0; m < std::min(Mp, m0 + kT); ++m) {
        uint16_t* dst = ap + m * Kp;
        for (int64_t k = k0; k < std::min(Kp, k0 + kT); ++k) dst[k] = (m < M && k < K) ? a[k * M + m] : 0;
      }
}

}  // namespace

bool amx_usable() {
  static const bool ok = [] {
    const char* env = std::getenv("MULTINORM_AMX");
    if (env && std::strcmp(env, "0") == 0) return false;
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
    if (!((edx >> 22) & 1u) || !((edx >> 24) & 1u)) return false;       // AMX-BF16, AMX-TILE
    if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx) || !((ecx >> 27) & 1u)) return false;  // OSXSAVE
    uint32_t lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if (((lo >> 17) & 3u) != 3u) return false;  // the OS saves XTILECFG and XTILEDATA
#ifdef __linux__
    // Linux hands the (8 KB) tile state to a process only on request.
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    if (::syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) return false;
#endif
    return true;
  }();
  return ok;
}

void amx_matmul(Buf out, const bf16* a_bf16, const bf16* b_bf16, int64_t M, int64_t N, int64_t K, bool trans_a,
                bool trans_b, bool accumulate, AmxScratch& scratch) {
  const auto* a = reinterpret_cast<const uint16_t*>(a_bf16);
  const auto* b = reinterpret_cast<const uint16_t*>(b_bf16);
  const int64_t Mp = round_up(M, kBlock), Np = round_up(N, kBlock), Kp = round_up(K, kTileK);
  if (static_cast<int64_t>(scratch.b.size()) < Np * Kp) scratch.b.resize(Np * Kp);
  pack_b(scratch.b.data(), b, N, K, Np, Kp, trans_b);
  // Row-major a whose rows are whole tiles is read in place.
  const bool direct = !trans_a && K == Kp && M == Mp;
  const uint16_t* A = a;
  if (!direct) {
    if (static_cast<int64_t>(scratch.a.size()) < Mp * Kp) scratch.a.resize(Mp * Kp);
    pack_a(scratch.a.data(), a, M, K, Mp, Kp, trans_a);
    A = scratch.a.data();
  }
  const uint16_t* B = scratch.b.data();
  const int64_t lda = Kp, a_stride = lda * 2, kpairs = Kp / 2;
  const bool f32 = out.dtype == DType::F32;
  float* out_f = static_cast<float*>(out.ptr);
  bf16* out_h = static_cast<bf16*>(out.ptr);
#pragma omp parallel
  {
    configure_tiles();
    alignas(64) float tile[kBlock * kBlock];
#pragma omp for collapse(2) schedule(static)
    for (int64_t m0 = 0; m0 < Mp; m0 += kBlock)
      for (int64_t n0 = 0; n0 < Np; n0 += kBlock) {
        // FP32 output blocks inside the matrix are accumulated in place; the rest go through `tile`.
        const bool in_place = f32 && m0 + kBlock <= M && n0 + kBlock <= N;
        float* c = out_f + m0 * N + n0;
        const int64_t ldc = N * 4;
        if (in_place && accumulate) {
          _tile_loadd(0, c, ldc);
          _tile_loadd(1, c + 16, ldc);
          _tile_loadd(2, c + 16 * N, ldc);
          _tile_loadd(3, c + 16 * N + 16, ldc);
        } else {
          _tile_zero(0);
          _tile_zero(1);
          _tile_zero(2);
          _tile_zero(3);
        }
        const uint16_t* a0 = A + m0 * lda;
        const uint16_t* b0 = B + (n0 / 16) * kpairs * 32;
        const uint16_t* b1 = b0 + kpairs * 32;
        for (int64_t k0 = 0; k0 < Kp; k0 += kTileK) {
          _tile_loadd(4, a0 + k0, a_stride);
          _tile_loadd(5, a0 + 16 * lda + k0, a_stride);
          _tile_loadd(6, b0 + k0 * 16, 64);
          _tile_loadd(7, b1 + k0 * 16, 64);
          _tile_dpbf16ps(0, 4, 6);
          _tile_dpbf16ps(1, 4, 7);
          _tile_dpbf16ps(2, 5, 6);
          _tile_dpbf16ps(3, 5, 7);
        }
        if (in_place) {
          _tile_stored(0, c, ldc);
          _tile_stored(1, c + 16, ldc);
          _tile_stored(2, c + 16 * N, ldc);
          _tile_stored(3, c + 16 * N + 16, ldc);
          continue;
        }
        _tile_stored(0, tile, kBlock * 4);
        _tile_stored(1, tile + 16, kBlock * 4);
        _tile_stored(2, tile + 16 * kBlock, kBlock * 4);
        _tile_stored(3, tile + 16 * kBlock + 16, kBlock * 4);
        const int64_t rows = std::min(kBlock, M - m0), cols = std::min(kBlock, N - n0);
        for (int64_t r = 0; r < rows; ++r) {
          const float* t = tile + r * kBlock;
          const int64_t at = (m0 + r) * N + n0;
          if (f32) {
            for (int64_t j = 0; j < cols; ++j) out_f[at + j] = accumulate ? out_f[at + j] + t[j] : t[j];
          } else {
            for (int64_t j = 0; j < cols; ++j)
              out_h[at + j] = to_bf16(accumulate ? to_f32(out_h[at + j]) + t[j] : t[j]);
          }
        }
      }
    _tile_release();
  }
}

}  // namespace multinorm::cpu
