// The packed BF16 GEMM: operands packed into the AMX tiles' layouts (amx_tiles.h), 32 x 32 FP32
// output blocks, on one of two block engines with the same operands:
//   - Intel AMX tiles (Sapphire Rapids and later): 16x16 FP32 accumulator tiles fed by 16x32 BF16
//     tiles, TDPBF16PS (1,024 multiply-adds per instruction). Debian 12's oneDNN (2.6) cannot use
//     these tiles on the machines we run on (it reads the tile palette from CPUID leaf 0x1D, which
//     hypervisors such as KVM leave empty, configures zero-row tiles and dies with SIGILL), so the
//     CPU backend drives them itself;
//   - AVX512_BF16 without AMX (AMD Zen 4 and later): VDPBF16PS (dpbf16_block.h), as fast as oneDNN's
//     brgemm on the models' shapes (0.98-1.07x) and what lets the fused epilogues run there too.
// oneDNN serves every other GEMM (FP32, batched, CPUs with neither).
//
// Cost per GEMM out[M,N] (+)= op(a)[M,K] op(b)[K,N]: 2 M N K FLOPs on the engine; b is repacked once
// into the tiles' pair-interleaved ("VNNI") layout (K N elements read and written), and a is repacked
// into padded rows only when it is transposed or its shape is not a multiple of the tile (M K read and
// written, 32 rows at a time into each thread's own buffer, so those writes stay in its L2: the
// weight gradients, whose a is transposed).
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <vector>

#include "../common/bf16.h"
#include "multinorm/backend.h"

namespace multinorm::cpu {

// True when the CPU has AMX-TILE and AMX-BF16, the OS enabled the tile state and granted this
// process its use (Linux arch_prctl), and MULTINORM_AMX is not "0". Decided once.
bool amx_usable();
// True when the CPU and OS run AVX-512 with BF16 dot products (VDPBF16PS; AMD Zen 4 and later,
// Intel Cooper Lake and every CPU with AMX). Decided once.
bool avx512_bf16_usable();
// The packed BF16 GEMM below runs here: on the AMX tiles where amx_usable(), else on VDPBF16PS;
// MULTINORM_PACKED_GEMM=0 hands BF16 GEMMs to oneDNN instead. Decided once.
bool packed_bf16_gemm_usable();

// packed_matmul's run of output blocks for one thread: (front << 32 | end), changed by compare-and-swap.
struct alignas(64) BlockRun {  // one per cache line
  std::atomic<uint64_t> word{0};
};
// Packed operands, reused from call to call (no allocation once the largest shape was seen); each
// grows to exactly the largest request, so bytes() is what it holds (the memory estimate predicts it:
// packed_gemm_elements).
struct PackedScratch {
  std::vector<uint16_t> a, b;
  std::vector<BlockRun> runs;  // one per thread (a few cache lines; not counted in bytes())
  int64_t bytes() const { return static_cast<int64_t>((a.capacity() + b.capacity()) * sizeof(uint16_t)); }
};

// The elements packed_matmul packs for one GEMM on `threads` threads: b always (Np x Kp); a when it is
// transposed or its shape is not a multiple of the tile (32 rows of Kp + 32 per thread, and per strip
// of a pass for packed_matmul_row_strips; else 0). Shared with the memory estimate.
struct PackedElements {
  int64_t a, b;
};
PackedElements packed_gemm_elements(int64_t M, int64_t N, int64_t K, bool trans_a, int threads, int64_t strips_per_thread = 1);

// out[M,N] (+)= op(a)[M,K] op(b)[K,N] for BF16 a and b, FP32 or BF16 out, row-major storage (a
// transposed operand is stored [K,M] / [N,K]). Deterministic: each output tile is summed by one
// thread in a fixed order of K.
void packed_matmul(Buf out, const bf16* a, const bf16* b, int64_t M, int64_t N, int64_t K, bool trans_a, bool trans_b,
                   bool accumulate, PackedScratch& scratch);

// out[M,N] = a[M,K] op(b)[K,N] (FP32) in strips of 32 rows, for an epilogue that needs whole rows
// (the loss head's cross-entropy, SwiGLU): each thread computes `strips_per_pass` strips (rows
// m0..m0+rows-1) into its own strips_per_pass x 32 x round_up(N, 32) floats at strips + thread *
// strip_stride (row r at strip + r * ld), in column groups whose b panels stay in its L2 while the
// pass's strips take them, and hands them to consume(strip, ld, m0, rows) while they are in its
// cache. The strips hold the same FP32 values as packed_matmul's out, whatever strips_per_pass (1 to
// kMaxRowStripsPerPass); the consumer may overwrite them, and use the floats past them up to
// strip_stride.
using RowStripConsumer = std::function<void(float* strip, int64_t ld, int64_t m0, int64_t rows)>;
void packed_matmul_row_strips(const bf16* a, const bf16* b, int64_t M, int64_t N, int64_t K, bool trans_b,
                              int64_t strips_per_pass, PackedScratch& scratch, float* strips, int64_t strip_stride,
                              const RowStripConsumer& consume);
// The strips per pass for op(b) [K, N] on `threads` threads: 1 where the packed b (N x K BF16) fits
// half the L3, so the strips after the first find it there; else 2 or 4, as many as fit the thread's
// share of the L3, so a b that streams from memory (the loss head's [V, C]: 32 MB at llama_60m) does
// so once per pass rather than once per strip. The 2-core Zen 4 (32 MB L3), the loss head
// of 1024 rows at V = 32000, C = 512: 115-120 ms with one strip a pass, 102-105 ms with four.
constexpr int64_t kMaxRowStripsPerPass = 4;
int64_t row_strips_per_pass(int64_t N, int64_t K, int threads);

}  // namespace multinorm::cpu
