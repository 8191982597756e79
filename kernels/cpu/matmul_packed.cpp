#include "matmul_packed.h"

#include <cpuid.h>
#include <immintrin.h>
#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "../common/bf16.h"
#include "amx_tiles.h"
#include "bf16_rows.h"
#include "cache_sizes.h"
#include "dpbf16_block.h"

namespace multinorm::cpu {

namespace {

using amx::kBlock;
using amx::kTileK;

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

constexpr int64_t kGroupBytes = 256 * 1024;  // packed b panels one column group holds (a quarter of an L2)

// b in the packed B layout of amx_tiles.h, zero padded to Np columns and Kp.
void pack_b(uint16_t* bp, const uint16_t* b, int64_t N, int64_t K, int64_t Np, int64_t Kp, bool trans_b) {
  const int64_t ldb = trans_b ? K : N;
#pragma omp parallel for schedule(static)
  for (int64_t nb = 0; nb < Np / 16; ++nb) amx::pack_b_panel(bp + nb * Kp * 16, b, ldb, nb, N, K, Kp, trans_b);
}

// Rows m0..m0+15 of the transposed a ([K, M] stored) into dst (16 rows of stride ldd, Kp columns):
// whole 32 x 16 blocks by the vector transpose, the edges and the padding element by element.
MULTINORM_AVX512_TARGET void pack_a_transposed_rows(uint16_t* dst, int64_t ldd, const uint16_t* a, int64_t m0,
                                                    int64_t M, int64_t K, int64_t Kp) {
  int64_t k0 = 0;
  if (m0 + 16 <= M)
    for (; k0 + 32 <= K; k0 += 32) amx::transpose_block_32x16(dst + k0, ldd, a + k0 * M + m0, M);
  for (int64_t r = 0; r < 16; ++r) {
    const int64_t m = m0 + r;
    uint16_t* d = dst + r * ldd;
    for (int64_t k = k0; k < Kp; ++k) d[k] = (m < M && k < K) ? a[k * M + m] : 0;
  }
}

// Rows m0..m0+rows-1 of op(a) into dst (row stride ldd, Kp columns, zero padded past K and M).
void pack_a_rows(uint16_t* dst, int64_t ldd, const uint16_t* a, int64_t m0, int64_t rows, int64_t M, int64_t K,
                 int64_t Kp, bool trans_a) {
  if (trans_a) {
    int64_t r = 0;
    if (rows == 32 && m0 + 32 <= M) {  // both halves of each 32 x 32 block while its 32 lines are in L1
      int64_t k0 = 0;
      for (; k0 + 32 <= K; k0 += 32) {
        amx::transpose_block_32x16(dst + k0, ldd, a + k0 * M + m0, M);
        amx::transpose_block_32x16(dst + 16 * ldd + k0, ldd, a + k0 * M + m0 + 16, M);
      }
      for (; r < 32; ++r)
        for (int64_t k = k0; k < Kp; ++k) dst[r * ldd + k] = k < K ? a[k * M + m0 + r] : 0;
      return;
    }
    for (; r < rows; r += 16) pack_a_transposed_rows(dst + r * ldd, ldd, a, m0 + r, M, K, Kp);
    return;
  }
  for (int64_t r = 0; r < rows; ++r) {
    uint16_t* d = dst + r * ldd;
    if (m0 + r < M) {
      std::memcpy(d, a + (m0 + r) * K, K * sizeof(uint16_t));
      std::fill(d + K, d + Kp, 0);
    } else {
      std::fill(d, d + Kp, 0);
    }
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

bool avx512_bf16_usable() {
  // libgcc's check covers the OS's saving of the AVX-512 state as well as CPUID. BW: the packing
  // (amx_tiles.h) uses it.
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512bf16");
  return ok;
}

bool packed_bf16_gemm_usable() {
  static const bool ok = [] {
    const char* env = std::getenv("MULTINORM_PACKED_GEMM");
    if (env && std::strcmp(env, "0") == 0) return false;
    return amx_usable() || avx512_bf16_usable();
  }();
  return ok;
}

bool fuses_gemm_epilogues(bool bf16_operands) { return bf16_operands && packed_bf16_gemm_usable(); }

namespace {

// The 32 x 32 block product on this CPU's engine: the AMX tiles, else VDPBF16PS on the same operands
// (dpbf16_block.h). Each thread of a parallel region begins before its first block and ends after
// its last (AMX tile configuration is per-thread state).
struct BlockEngine {
  const bool tiles = amx_usable();
  void begin() const {
    if (tiles) amx::configure_tiles();
  }
  void end() const {
    if (tiles) amx::release_tiles();
  }
  void block(float* c, int64_t ldc, bool accumulate, const uint16_t* a, int64_t lda, const uint16_t* b,
             int64_t panel_stride, int64_t K) const {
    if (tiles)
      amx::block_32x32(c, ldc, accumulate, a, lda, b, panel_stride, K);
    else
      dpbf16::block_32x32(c, ldc, accumulate, a, lda, b, panel_stride, K);
  }
};

// a is read in place when it is row-major and its rows are whole tiles; else it is packed.
bool a_needs_packing(int64_t M, int64_t K, bool trans_a) {
  return trans_a || K != round_up(K, kTileK) || M != round_up(M, kBlock);
}

// A packed strip's row stride: Kp and one cache line more, so that the 16 rows one tile load reads
// do not all fall in one L1 set when Kp is a multiple of 2,048 (the weight gradients' K = B*T).
int64_t strip_lda(int64_t Kp) { return Kp + 32; }

}  // namespace

PackedElements packed_gemm_elements(int64_t M, int64_t N, int64_t K, bool trans_a, int threads, int64_t strips_per_thread) {
  const int64_t Np = round_up(N, kBlock), Kp = round_up(K, kTileK);
  const int64_t a = a_needs_packing(M, K, trans_a) ? std::max(threads, 1) * strips_per_thread * kBlock * strip_lda(Kp) : 0;
  return {a, Np * Kp};
}

int64_t row_strips_per_pass(int64_t N, int64_t K, int threads) {
  const int64_t Np = round_up(N, kBlock), Kp = round_up(K, kTileK), l3 = l3_bytes();
  if (l3 <= 0 || Np * Kp * 2 <= l3 / 2) return 1;
  const int64_t fit = l3 / std::max(threads, 1) / (kBlock * Np * static_cast<int64_t>(sizeof(float)));
  return fit >= kMaxRowStripsPerPass ? kMaxRowStripsPerPass : fit >= 2 ? 2 : 1;
}

namespace {

// Grown to the exact size (resize may reserve up to twice), so the scratch is what the estimate says.
void hold(std::vector<uint16_t>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v = std::vector<uint16_t>(static_cast<size_t>(n));
}

// Blocks 0..count-1 in one contiguous run per thread, held in `runs` (grown to the thread count once).
// take(t) hands thread t the front block of its own run while one is left, then the back block of
// another thread's run (the next thread's first), and -1 when every run is empty. An owner and a
// thief change a run's (front, end) word by compare-and-swap, so they never take the same block.
class BlockRuns {
 public:
  BlockRuns(std::vector<BlockRun>& runs, int64_t count, int threads) : runs_(runs), n_(std::max(threads, 1)) {
    if (static_cast<int64_t>(runs_.size()) < n_) runs_ = std::vector<BlockRun>(static_cast<size_t>(n_));
    for (int64_t t = 0; t < n_; ++t) runs_[t].word.store(pack(count * t / n_, count * (t + 1) / n_), std::memory_order_relaxed);
  }
  int64_t take(int thread) {
    for (int64_t k = 0; k < n_; ++k) {
      std::atomic<uint64_t>& word = runs_[(thread + k) % n_].word;
      const bool own = k == 0;
      uint64_t w = word.load(std::memory_order_relaxed);
      while (front(w) < end(w)) {
        const uint64_t taken = own ? pack(front(w) + 1, end(w)) : pack(front(w), end(w) - 1);
        if (word.compare_exchange_weak(w, taken, std::memory_order_relaxed)) return own ? front(w) : end(w) - 1;
      }
    }
    return -1;
  }

 private:
  static uint64_t pack(int64_t front, int64_t end) { return static_cast<uint64_t>(front) << 32 | static_cast<uint64_t>(end); }
  static int64_t front(uint64_t w) { return static_cast<int64_t>(w >> 32); }
  static int64_t end(uint64_t w) { return static_cast<int64_t>(w & 0xffffffffu); }
  std::vector<BlockRun>& runs_;
  const int64_t n_;
};

// One GEMM's operands as the tiles read them. b is packed whole (every thread reads all of it). a is
// read in place when its rows are whole tiles; else each thread packs the 32-row strip it is about to
// run into its own buffer (`strip`: one per thread, or `strips_per_thread` for the row strips' passes),
// so the packed rows are written to, and read back from, its L2 rather than memory (llama_tiny's
// weight gradients at 16 x 256: 150 MB a step).
struct TileOperands {
  TileOperands(const bf16* a_bf16, const bf16* b, int64_t M_, int64_t N, int64_t K_, bool trans_a_, bool trans_b,
               PackedScratch& scratch, int64_t strips_per_thread = 1)
      : a(reinterpret_cast<const uint16_t*>(a_bf16)), M(M_), K(K_), trans_a(trans_a_), Mp(round_up(M_, kBlock)),
        Np(round_up(N, kBlock)), Kp(round_up(K_, kTileK)), packs_a(a_needs_packing(M_, K_, trans_a_)),
        lda(packs_a ? strip_lda(Kp) : Kp), slots(strips_per_thread) {
    hold(scratch.b, Np * Kp);
    pack_b(scratch.b.data(), reinterpret_cast<const uint16_t*>(b), N, K, Np, Kp, trans_b);
    B = scratch.b.data();
    if (packs_a) {
      hold(scratch.a, omp_get_max_threads() * slots * kBlock * lda);
      strips = scratch.a.data();
    }
  }
  // Rows m0..m0+31 of op(a) as the tiles read them (row stride lda): in place, or packed by the
  // calling thread into its own strip `slot`.
  const uint16_t* rows(int64_t m0, int64_t slot = 0) const {
    if (!packs_a) return a + m0 * Kp;
    uint16_t* strip = strips + (static_cast<int64_t>(omp_get_thread_num()) * slots + slot) * kBlock * lda;
    pack_a_rows(strip, lda, a, m0, kBlock, M, K, Kp, trans_a);
    return strip;
  }
  // b's packed panels for columns n0..n0+31.
  const uint16_t* panels(int64_t n0) const { return B + n0 * Kp; }

  const uint16_t* a;
  const int64_t M, K;
  const bool trans_a;
  const int64_t Mp, Np, Kp;
  const bool packs_a;
  const int64_t lda;
  const int64_t slots;  // packed 32-row strips per thread
  const uint16_t* B = nullptr;
  uint16_t* strips = nullptr;
};

// Output blocks in a column group: the group's packed b panels (at most kGroupBytes) stay in L2 while
// strips of a pass them.
int64_t group_blocks(int64_t Kp) { return std::max<int64_t>(1, kGroupBytes / (Kp * 2 * kBlock)); }

// out's 32 x 32 block at (m0, n0) = (or +=) a's rows a0 (stride lda) times b's panels b0. FP32
// blocks inside the matrix are accumulated in place; the rest go through `tile` (32 x 32 floats).
void out_block(const BlockEngine& engine, Buf out, int64_t M, int64_t N, bool accumulate, int64_t m0, int64_t n0,
               const uint16_t* a0, int64_t lda, const uint16_t* b0, int64_t Kp, float* tile) {
  const bool f32 = out.dtype == DType::F32;
  float* out_f = static_cast<float*>(out.ptr);
  bf16* out_h = static_cast<bf16*>(out.ptr);
  if (f32 && m0 + kBlock <= M && n0 + kBlock <= N) {
    engine.block(out_f + m0 * N + n0, N, accumulate, a0, lda, b0, Kp * 16, Kp);
    return;
  }
  engine.block(tile, kBlock, false, a0, lda, b0, Kp * 16, Kp);
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

}  // namespace

void packed_matmul(Buf out, const bf16* a, const bf16* b, int64_t M, int64_t N, int64_t K, bool trans_a, bool trans_b,
                   bool accumulate, PackedScratch& scratch) {
  const TileOperands op(a, b, M, N, K, trans_a, trans_b, scratch);
  // Blocks go in column groups of `group` columns, and row order inside a group: a group's panels
  // (at most kGroupBytes) stay in L2 while every strip of a passes them, where a wide b (the loss
  // head's [V, C]: 32 MB for llama_60m) read whole for each strip would come from memory M/32 times.
  // A packed a is never split into groups (each group would pack its strips again); its GEMMs (the
  // weight gradients) have small N.
  const int64_t row_blocks = op.Np / kBlock, strips = op.Mp / kBlock;
  const int64_t group = op.packs_a ? row_blocks : group_blocks(op.Kp);
  const int64_t blocks = strips * row_blocks;
  // Each thread owns an equal, contiguous run of the blocks in that order, and runs it from the
  // front; a thread that finishes its own run takes the other threads' remaining blocks from the
  // back of their runs (BlockRuns). With the runs alone, one of this VM's two cores idled 5-30% of
  // many GEMMs' time, as the cores run at unequal, shifting speeds; blocks handed out one at a time
  // to whichever thread asked (a dynamic schedule) lost the runs' locality and was slower where the
  // cores ran alike. A thread gets a's rows anew when its next block lies in another strip than its
  // last: a strip split between two threads is packed by both.
  const int threads = omp_get_max_threads();
  BlockRuns runs(scratch.runs, blocks, threads);
  const BlockEngine engine;
#pragma omp parallel num_threads(threads)
  {
    engine.begin();
    alignas(64) float tile[kBlock * kBlock];
    const uint16_t* a0 = nullptr;
    int64_t a0_m0 = -1;
    for (int64_t i; (i = runs.take(omp_get_thread_num())) >= 0;) {
      const int64_t g0 = i / (strips * group) * group, width = std::min(group, row_blocks - g0);  // the group's blocks
      const int64_t in_group = i - g0 * strips, m0 = in_group / width * kBlock, n0 = (g0 + in_group % width) * kBlock;
      if (m0 != a0_m0) a0 = op.rows(m0), a0_m0 = m0;
      out_block(engine, out, M, N, accumulate, m0, n0, a0, op.lda, op.panels(n0), op.Kp, tile);
    }
    engine.end();
  }
}

void packed_matmul_row_strips(const bf16* a, const bf16* b, int64_t M, int64_t N, int64_t K, bool trans_b,
                              int64_t strips_per_pass, PackedScratch& scratch, float* strips, int64_t strip_stride,
                              const RowStripConsumer& consume) {
  const int64_t S = std::clamp<int64_t>(strips_per_pass, 1, kMaxRowStripsPerPass);
  const TileOperands op(a, b, M, N, K, false, trans_b, scratch, S);
  const int64_t ld = op.Np, group = group_blocks(op.Kp) * kBlock;
  const BlockEngine engine;
#pragma omp parallel
  {
    engine.begin();
    float* strip = strips + static_cast<int64_t>(omp_get_thread_num()) * strip_stride;
    const uint16_t* a_rows[kMaxRowStripsPerPass];
#pragma omp for schedule(dynamic, 1)  // taken as the threads finish (see packed_matmul)
    for (int64_t m0 = 0; m0 < op.Mp; m0 += S * kBlock) {
      const int64_t count = std::min(S, (op.Mp - m0) / kBlock);
      for (int64_t s = 0; s < count; ++s) a_rows[s] = op.rows(m0 + s * kBlock, s);
      // A column group's panels, then the next group's, each through the pass's strips while it is in
      // L2. The same blocks, in the same order of K, as packed_matmul: the same FP32 values.
      for (int64_t g0 = 0; g0 < op.Np; g0 += group)
        for (int64_t s = 0; s < count; ++s)
          for (int64_t n0 = g0; n0 < std::min(op.Np, g0 + group); n0 += kBlock)
            engine.block(strip + s * kBlock * ld + n0, ld, false, a_rows[s], op.lda, op.panels(n0), op.Kp * 16, op.Kp);
      consume(strip, ld, m0, std::min(count * kBlock, M - m0));
    }
    engine.end();
  }
}

}  // namespace multinorm::cpu
