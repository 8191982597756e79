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
#include "amx_tiles.h"
#include "bf16_rows.h"

namespace multinorm::cpu {

namespace {

using amx::kBlock;
using amx::kTileK;

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// b in the packed B layout of amx_tiles.h, zero padded to Np columns and Kp.
void pack_b(uint16_t* bp, const uint16_t* b, int64_t N, int64_t K, int64_t Np, int64_t Kp, bool trans_b) {
  const int64_t ldb = trans_b ? K : N;
#pragma omp parallel for schedule(static)
  for (int64_t nb = 0; nb < Np / 16; ++nb) amx::pack_b_panel(bp + nb * Kp * 16, b, ldb, nb, N, K, Kp, trans_b);
}

// Rows m0..m0+15 of the transposed a ([K, M] stored) into ap [Mp][Kp]: whole 32 x 16 blocks by the
// vector transpose, the edges and the padding element by element.
MULTINORM_AVX512_TARGET void pack_a_transposed_rows(uint16_t* ap, const uint16_t* a, int64_t m0, int64_t M, int64_t K,
                                                    int64_t Kp) {
  int64_t k0 = 0;
  if (m0 + 16 <= M)
    for (; k0 + 32 <= K; k0 += 32) amx::transpose_block_32x16(ap + m0 * Kp + k0, Kp, a + k0 * M + m0, M);
  for (int64_t m = m0; m < m0 + 16; ++m) {
    uint16_t* dst = ap + m * Kp;
    for (int64_t k = k0; k < Kp; ++k) dst[k] = (m < M && k < K) ? a[k * M + m] : 0;
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
#pragma omp parallel for schedule(static)
  for (int64_t m0 = 0; m0 < Mp; m0 += 16) pack_a_transposed_rows(ap, a, m0, M, K, Kp);
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

AmxPacked amx_packed_elements(int64_t M, int64_t N, int64_t K, bool trans_a) {
  const int64_t Mp = round_up(M, kBlock), Np = round_up(N, kBlock), Kp = round_up(K, kTileK);
  const bool direct = !trans_a && K == Kp && M == Mp;
  return {direct ? 0 : Mp * Kp, Np * Kp};
}

namespace {

// The operands of one GEMM as the tiles read them: a's rows (in place when they already are whole
// tiles) and the packed b, in the scratch.
struct TileOperands {
  const uint16_t* A;
  const uint16_t* B;
  int64_t Mp, Np, Kp;
};

TileOperands pack_operands(const bf16* a_bf16, const bf16* b_bf16, int64_t M, int64_t N, int64_t K, bool trans_a,
                           bool trans_b, AmxScratch& scratch) {
  const auto* a = reinterpret_cast<const uint16_t*>(a_bf16);
  const auto* b = reinterpret_cast<const uint16_t*>(b_bf16);
  const int64_t Mp = round_up(M, kBlock), Np = round_up(N, kBlock), Kp = round_up(K, kTileK);
  const AmxPacked packed = amx_packed_elements(M, N, K, trans_a);
  // Grown to the exact size (resize may reserve up to twice), so the scratch is what the estimate says.
  auto hold = [](std::vector<uint16_t>& v, int64_t n) {
    if (static_cast<int64_t>(v.size()) < n) v = std::vector<uint16_t>(static_cast<size_t>(n));
  };
  hold(scratch.b, packed.b);
  pack_b(scratch.b.data(), b, N, K, Np, Kp, trans_b);
  const uint16_t* A = a;  // row-major a whose rows are whole tiles is read in place
  if (packed.a != 0) {
    hold(scratch.a, packed.a);
    pack_a(scratch.a.data(), a, M, K, Mp, Kp, trans_a);
    A = scratch.a.data();
  }
  return {A, scratch.b.data(), Mp, Np, Kp};
}

}  // namespace

void amx_matmul(Buf out, const bf16* a_bf16, const bf16* b_bf16, int64_t M, int64_t N, int64_t K, bool trans_a,
                bool trans_b, bool accumulate, AmxScratch& scratch) {
  const TileOperands op = pack_operands(a_bf16, b_bf16, M, N, K, trans_a, trans_b, scratch);
  const uint16_t *A = op.A, *B = op.B;
  const int64_t Mp = op.Mp, Np = op.Np, Kp = op.Kp;
  const int64_t lda = Kp, kpairs = Kp / 2;
  const bool f32 = out.dtype == DType::F32;
  float* out_f = static_cast<float*>(out.ptr);
  bf16* out_h = static_cast<bf16*>(out.ptr);
#pragma omp parallel
  {
    amx::configure_tiles();
    alignas(64) float tile[kBlock * kBlock];
#pragma omp for collapse(2) schedule(static)
    for (int64_t m0 = 0; m0 < Mp; m0 += kBlock)
      for (int64_t n0 = 0; n0 < Np; n0 += kBlock) {
        // FP32 output blocks inside the matrix are accumulated in place; the rest go through `tile`.
        const bool in_place = f32 && m0 + kBlock <= M && n0 + kBlock <= N;
        const uint16_t* a0 = A + m0 * lda;
        const uint16_t* b0 = B + (n0 / 16) * kpairs * 32;
        if (in_place) {
          amx::block_32x32(out_f + m0 * N + n0, N, accumulate, a0, lda, b0, kpairs * 32, Kp);
          continue;
        }
        amx::block_32x32(tile, kBlock, false, a0, lda, b0, kpairs * 32, Kp);
        const int64_t rows = std::min(kBlock, M - m0), cols = std::min(kBlock, N - n0);
        for (int64_t r = 0; r < rows; ++r) {
          float* t = tile + r * kBlock;
          const int64_t at = (m0 + r) * N + n0;
          if (f32) {
            for (int64_t j = 0; j < cols; ++j) out_f[at + j] = accumulate ? out_f[at + j] + t[j] : t[j];
          } else {
            if (accumulate)
              for (int64_t j = 0; j < cols; ++j) t[j] += to_f32(out_h[at + j]);
            round_row_to_bf16(t, out_h + at, cols);
          }
        }
      }
    amx::release_tiles();
  }
}

void amx_matmul_row_strips(const bf16* a, const bf16* b, int64_t M, int64_t N, int64_t K, bool trans_b,
                           AmxScratch& scratch, float* strips, const RowStripConsumer& consume) {
  const TileOperands op = pack_operands(a, b, M, N, K, false, trans_b, scratch);
  const int64_t lda = op.Kp, kpairs = op.Kp / 2, ld = op.Np;
#pragma omp parallel
  {
    amx::configure_tiles();
    float* strip = strips + static_cast<int64_t>(omp_get_thread_num()) * kBlock * ld;
#pragma omp for schedule(static)
    for (int64_t m0 = 0; m0 < op.Mp; m0 += kBlock) {
      // The same blocks, in the same order of K, as amx_matmul: the same FP32 values.
      for (int64_t n0 = 0; n0 < op.Np; n0 += kBlock)
        amx::block_32x32(strip + n0, ld, false, op.A + m0 * lda, lda, op.B + (n0 / 16) * kpairs * 32, kpairs * 32, op.Kp);
      consume(strip, ld, m0, std::min(kBlock, M - m0));
    }
    amx::release_tiles();
  }
}

}  // namespace multinorm::cpu
