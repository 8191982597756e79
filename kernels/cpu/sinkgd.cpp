// SinkGD (SR-Sinkhorn), fused. For W, G of shape [m, n]:
//   X = G; repeat L times: rows of X to norm sqrt(n), then columns of X to norm sqrt(m);
//   W <- W (1 - lr wd) - lr X
// X is never materialised: X = diag(u) G diag(v), with
//   row step     u_i = sqrt(n) / max(sqrt(sum_j G_ij^2 v_j^2), eps)
//   column step  v_j = sqrt(m) / max(sqrt(sum_i u_i^2 G_ij^2), eps)
// Each iteration is ONE pass over G: a row's sum gives u_i at once, and the same row (still in L1)
// then adds u_i^2 G_i,:^2 into the column sums. Column sums are reduced over a fixed number of row
// chunks, in order: the result is independent of the thread count. A zero row (column) gets a
// finite scale and contributes zero, so it receives a zero update, never NaN.
//
// The passes read G as FP32 rows. An FP32 G is read in place. A BF16 G is widened once into a
// cache of m x n floats where that fits the cores' L2 (sinkgd_caches_rows), so iterations 2..L and
// the W write read it from L2 without widening again (perf: the in-cache iterations were compute-
// bound, ~3.5 ms each on llama_60m's matrices, and the W write fetched G from memory a second time);
// otherwise each iteration widens its rows into a small per-thread buffer. Both paths compute the
// same FP32 values in the same order, so the choice never changes a bit.
// Cost: G read from memory once, W read and written once (Adam's order of traffic, and no state);
// per element and iteration about four FP32 operations (square, scale, two adds), from L1/L2.
//
// sinkgd_update_many (the optimizer's call: every matrix at once) runs each tensor whose G fits a
// core's cache budget (its L2 or its share of the L3: sinkgd_one_core_bytes) whole on one core
// (sinkgd_update_one_core below), the cores taking tensors largest first: no barrier per pass, and
// one core's memory-bound first pass and W write overlap the other core's passes out of cache. llama_60m's 56 matrices: 0.65-0.77x the time of one sinkgd_update per tensor
// (bench optim, same rounds, at 4cbd931 and 21472fb).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "../common/dtype_dispatch.h"
#include "bf16_rows.h"
#include "cache_sizes.h"
#include "cpu_kernels.h"

namespace multinorm::cpu {

namespace {
constexpr int64_t kColumnBlock = 256;
constexpr int64_t kRowGroup = kSinkgdRowGroup;  // rows whose sums and column contributions go together
constexpr int64_t kLanes = 64;                  // independent partial sums per row: four 16-wide vectors
enum Slot : size_t { kU = 20, kScales, kPartial, kRows, kCache };

// Adds acc[0..64) as a tree: log2(64) dependent steps, not 64; the order is fixed. Written out
// with constant widths so that it compiles to a few vector adds: as a loop over the width, GCC
// emitted the narrow steps as scalar loops through the stack, ~30% of an in-L2 pass at n = 512
// (perf annotate; 0.12 -> 0.10 ns per element and pass). The same adds in the same order as that
// loop, so the same bits.
inline float tree_sum(float* acc) {
  static_assert(kLanes == 64, "the tree is written out for 64 lanes");
#pragma omp simd
  for (int64_t k = 0; k < 32; ++k) acc[k] += acc[k + 32];
#pragma omp simd
  for (int64_t k = 0; k < 16; ++k) acc[k] += acc[k + 16];
#pragma omp simd
  for (int64_t k = 0; k < 8; ++k) acc[k] += acc[k + 8];
#pragma omp simd
  for (int64_t k = 0; k < 4; ++k) acc[k] += acc[k + 4];
  acc[0] += acc[2];
  acc[1] += acc[3];
  return acc[0] + acc[1];
}

// sum_j x_j^2 v2_j for R FP32 rows x[q]: 64 partial sums per row (one accumulator would make the
// loop wait on the FMA latency), j mod 64 into lane j mod 64, then the tree; v2 loaded once for
// all R rows.
template <int R>
inline void row_sums(const float* const* x, const float* v2, int64_t n, float* sums) {
  float acc[R][kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int q = 0; q < R; ++q)
#pragma omp simd
      for (int64_t k = 0; k < kLanes; ++k) acc[q][k] += (x[q][j + k] * x[q][j + k]) * v2[j + k];
  for (int64_t k = 0; j < n; ++j, ++k)
    for (int q = 0; q < R; ++q) acc[q][k] += (x[q][j] * x[q][j]) * v2[j];
  for (int q = 0; q < R; ++q) sums[q] = tree_sum(acc[q]);
}

// ---- Pair order ------------------------------------------------------------------------------
// A BF16 gradient is widened 32 values at a time, as two 16-lane vectors: the even columns (each
// 32-bit word shifted up by 16) and the odd ones (each word's high half, masked). That is two
// vector operations per 32 values where widening in column order takes five (a zero-extension per
// 16, one of them on an extracted half, and a shift per 16). One core's pass over a 1376 x 512
// BF16 G in L2, with the prefetch below: 0.097 ns per element in column order, 0.088 in pair order
// (medians of 8 interleaved runs; 0.104 with neither).
// So for a BF16 G the passes keep the rows they widen, v, v^2 and the column sums in *pair order*:
// in each whole block of 32 columns, positions 0..15 hold the even columns and 16..31 the odd ones;
// columns after the last whole block keep their place. Sums run over positions, so both kernels add
// in the same fixed order; v returns to column order (column_order) for the W write. An FP32 G is
// read in place, in column order.
constexpr int64_t kPairBlock = 32;
template <class G>
constexpr bool kPaired = std::is_same_v<G, bf16>;

inline float f32_of_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// g[0..32) widened into out[0..32) in pair order.
inline void widen_pair_block(const bf16* g, float* out) {
  uint32_t words[kPairBlock / 2];  // word k holds columns 2k (low half) and 2k + 1 (high half)
  std::memcpy(words, g, sizeof(words));
#pragma omp simd
  for (int64_t k = 0; k < kPairBlock / 2; ++k) {
    out[k] = f32_of_bits(words[k] << 16);
    out[k + kPairBlock / 2] = f32_of_bits(words[k] & 0xffff0000u);
  }
}

// Asks for the cache line kPrefetchBytes after p: G's rows stream from L2 (one core's passes) or
// memory, and the hardware prefetchers left the widening loop waiting on them (that loop alone:
// 0.050 ns per element with its rows in L2, 0.044 in L1, 0.043 in L2 with this prefetch). The line
// 2 KB ahead: about two rows of 512 columns.
// Integer arithmetic: the address may lie past the tensor, and a prefetch never faults.
constexpr uintptr_t kPrefetchBytes = 2048;
inline void prefetch_bytes_ahead(const void* p, uintptr_t bytes) {
  __builtin_prefetch(reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(p) + bytes));
}
inline void prefetch_ahead(const void* p) { prefetch_bytes_ahead(p, kPrefetchBytes); }

// The same, into L2 only (PREFETCHT1): the streams from memory (the first pass's G, the W write's W)
// are asked for 8-16 KB ahead. Asked into L1 (PREFETCHT0, or PREFETCHW for W), each line in flight
// holds one of the core's few L1 miss buffers, and one core's stream stalled on them: llama_60m's
// 56 matrices (sinkgd_update_many, phases timed per core, same process, alternating, best of 12):
// the first pass 3.7 -> 2.2 ms per core with G asked for 16 KB ahead into L2 rather than one row
// group ahead into L1 (16 KB into L1: 3.7 ms again), the W write 2.7-3.0 -> 2.2 ms; the whole call
// 12.3-13.9 -> 9.8-11.5 ms; llama_130m's 84 matrices 41.3 -> 33.5 ms.
inline void prefetch_to_l2(const void* p, uintptr_t bytes) {
  __builtin_prefetch(reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(p) + bytes), 0, 2);  // PREFETCHT1
}
constexpr uintptr_t kStreamPrefetchBytes = 16384;

// The one-core W write reads W from memory, a row after another: the hardware prefetchers alone
// kept too few lines in flight for one core (llama_60m's 56 matrices through sinkgd_update_many,
// two sets of 8 interleaved runs: median 12.6-13.0 ms without, 11.8-11.9 ms with the lines asked
// for 8 KB ahead; then into L2 rather than L1 for writing, as prefetch_to_l2 says).
constexpr uintptr_t kWritePrefetchBytes = 8192;

// x (n values in pair order) into column order.
inline void column_order(const float* x, int64_t n, float* out) {
  int64_t j = 0;
  for (; j + kPairBlock <= n; j += kPairBlock)
#pragma omp simd
    for (int64_t k = 0; k < kPairBlock / 2; ++k) {
      out[j + 2 * k] = x[j + k];
      out[j + 2 * k + 1] = x[j + kPairBlock / 2 + k];
    }
  for (; j < n; ++j) out[j] = x[j];
}

// What a row-sum pass keeps of the row it reads, in the passes' order (pair order for BF16): g_j in
// FP32 (a widened row, read again by the later passes), g_j^2 (all a column add needs), or nothing
// (the one-core kernel's row groups, whose column adds square the BF16 rows again: add_group_columns).
enum class Keep { kValues, kSquares, kNothing };
template <Keep K>
inline void keep_value(float* out, int64_t j, float y) {
  if constexpr (K == Keep::kValues) out[j] = y;
  if constexpr (K == Keep::kSquares) out[j] = y * y;
}

// The sum of row_sums for one row g of either type (the same lanes and tree: the same bits),
// keeping the row on the way as K says.
template <Keep K>
inline float row_sum_store(const float* g, const float* v2, int64_t n, float* out) {
  float acc[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
#pragma omp simd
    for (int64_t k = 0; k < kLanes; ++k) {
      const float y = g[j + k];
      keep_value<K>(out, j + k, y);
      acc[k] += (y * y) * v2[j + k];
    }
  for (int64_t k = 0; j < n; ++j, ++k) {
    const float y = g[j];
    keep_value<K>(out, j, y);
    acc[k] += (y * y) * v2[j];
  }
  return tree_sum(acc);
}
// From position j (a multiple of 64) to the row's end: at most one pair block, then the last
// columns in place; lanes and tree as below.
template <Keep K>
inline float row_sum_store_tail(const bf16* g, const float* v2, int64_t n, int64_t j, float* out, float* acc) {
  if (j + kPairBlock <= n) {
    float y[kPairBlock];
    widen_pair_block(g + j, y);
#pragma omp simd
    for (int64_t k = 0; k < kPairBlock; ++k) {
      keep_value<K>(out, j + k, y[k]);
      acc[k] += (y[k] * y[k]) * v2[j + k];
    }
    j += kPairBlock;
  }
  for (; j < n; ++j) {
    const float y = to_f32(g[j]);
    keep_value<K>(out, j, y);
    acc[j % kLanes] += (y * y) * v2[j];
  }
  return tree_sum(acc);
}
template <Keep K>
inline float row_sum_store(const bf16* g, const float* v2, int64_t n, float* out) {
  float acc[kLanes] = {};
  int64_t j = 0;
  // Position j goes into lane j mod 64, as in row_sums: whole 64-blocks, at most one pair block,
  // then the last columns in place.
  for (; j + kLanes <= n; j += kLanes) {
    prefetch_ahead(g + j);
    prefetch_ahead(g + j + kPairBlock);
    float y[kLanes];
    widen_pair_block(g + j, y);
    widen_pair_block(g + j + kPairBlock, y + kPairBlock);
#pragma omp simd
    for (int64_t k = 0; k < kLanes; ++k) {
      keep_value<K>(out, j + k, y[k]);
      acc[k] += (y[k] * y[k]) * v2[j + k];
    }
  }
  return row_sum_store_tail<K>(g, v2, n, j, out, acc);
}

// row_sum_store for the kRowGroup rows g + q n (q < kRowGroup), row q kept (as K says) at out + q n
// and its sum in sums[q]. Where AVX-512 is compiled in, a BF16 group goes through its 64-column
// blocks four rows at a time: v^2 loaded once for the four rows, the 16 accumulators (4 rows x 64
// lanes) in registers, and the sums' trees added in registers. The portable loop, a row after
// another, reloads v^2 per row, and GCC 12 spills its tree through memory. One Zen 4 core, one pass
// (row sums, squares stored, column adds) over a 512 x 512 BF16 G in L2: 0.105 ns per element the
// portable way, 0.073 this way (microbenchmark, with the squares on cache lines). The same lanes,
// products and tree as the portable loop: the same bits (tests:
// SinkGD.CachedAndStreamedBf16RowsGiveTheSameBits).
template <Keep K, class G>
inline void row_group_sum_store(const G* g, const float* v2, int64_t n, float* out, float* sums) {
  for (int64_t q = 0; q < kRowGroup; ++q)
    sums[q] = row_sum_store<K>(g + q * n, v2, n, K == Keep::kNothing ? nullptr : out + q * n);
}
#if defined(__AVX512F__)
// GCC 12 reports the intrinsics' own _mm512_undefined_* placeholders as uninitialised (bug 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
template <Keep K>
inline void row_group_sum_store(const bf16* g, const float* v2, int64_t n, float* out, float* sums) {
  static_assert(kRowGroup == 4 && kLanes == 64, "written out for four rows of 64 lanes");
  const __m512i high_halves = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  __m512 acc[kRowGroup][4];
  for (auto& row : acc)
    for (auto& a : row) a = _mm512_setzero_ps();
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    const __m512 v2_0 = _mm512_loadu_ps(v2 + j), v2_1 = _mm512_loadu_ps(v2 + j + 16);
    const __m512 v2_2 = _mm512_loadu_ps(v2 + j + 32), v2_3 = _mm512_loadu_ps(v2 + j + 48);
    for (int64_t q = 0; q < kRowGroup; ++q) {
      const bf16* gq = g + q * n + j;
      prefetch_to_l2(gq, kStreamPrefetchBytes);
      prefetch_to_l2(gq + kPairBlock, kStreamPrefetchBytes);
      // Pair order: a 32-column block's even columns (each word's low half, shifted up), then its odd
      // ones (each word's high half), as widen_pair_block.
      const __m512i w0 = _mm512_loadu_si512(gq), w1 = _mm512_loadu_si512(gq + kPairBlock);
      const __m512 y0 = _mm512_castsi512_ps(_mm512_slli_epi32(w0, 16));
      const __m512 y1 = _mm512_castsi512_ps(_mm512_and_si512(w0, high_halves));
      const __m512 y2 = _mm512_castsi512_ps(_mm512_slli_epi32(w1, 16));
      const __m512 y3 = _mm512_castsi512_ps(_mm512_and_si512(w1, high_halves));
      const __m512 s0 = _mm512_mul_ps(y0, y0), s1 = _mm512_mul_ps(y1, y1);
      const __m512 s2 = _mm512_mul_ps(y2, y2), s3 = _mm512_mul_ps(y3, y3);
      if constexpr (K != Keep::kNothing) {
        constexpr bool sq = K == Keep::kSquares;
        float* o = out + q * n + j;
        _mm512_storeu_ps(o, sq ? s0 : y0);
        _mm512_storeu_ps(o + 16, sq ? s1 : y1);
        _mm512_storeu_ps(o + 32, sq ? s2 : y2);
        _mm512_storeu_ps(o + 48, sq ? s3 : y3);
      }
      acc[q][0] = _mm512_fmadd_ps(s0, v2_0, acc[q][0]);
      acc[q][1] = _mm512_fmadd_ps(s1, v2_1, acc[q][1]);
      acc[q][2] = _mm512_fmadd_ps(s2, v2_2, acc[q][2]);
      acc[q][3] = _mm512_fmadd_ps(s3, v2_3, acc[q][3]);
    }
  }
  for (int64_t q = 0; q < kRowGroup; ++q) {
    if (j < n) {  // the tail's lanes in memory, then tree_sum
      alignas(64) float lanes[kLanes];
      for (int p = 0; p < 4; ++p) _mm512_store_ps(lanes + 16 * p, acc[q][p]);
      sums[q] = row_sum_store_tail<K>(g + q * n, v2, n, j, K == Keep::kNothing ? nullptr : out + q * n, lanes);
      continue;
    }
    // tree_sum's adds in registers (through memory, each narrower reload of the lanes just stored
    // waits on the store): lanes k and k + 32, then k + 16, k + 8, k + 4, then (0 + 2) + (1 + 3).
    const __m512 t16 = _mm512_add_ps(_mm512_add_ps(acc[q][0], acc[q][2]), _mm512_add_ps(acc[q][1], acc[q][3]));
    const __m256 t8 = _mm256_add_ps(_mm512_castps512_ps256(t16),
                                    _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(t16), 1)));
    const __m128 t4 = _mm_add_ps(_mm256_castps256_ps128(t8), _mm256_extractf128_ps(t8, 1));
    alignas(16) float t[4];
    _mm_store_ps(t, t4);
    sums[q] = (t[0] + t[2]) + (t[1] + t[3]);
  }
}
#pragma GCC diagnostic pop
#endif

// a b + c, rounded once where the target has FMA (as GCC contracted the plain expression there, and
// as the vector code below computes it), twice where it has not.
inline float mul_add(float a, float b, float c) {
#if defined(__FMA__)
  return std::fma(a, b, c);
#else
  return a * b + c;
#endif
}

// A column's sum plus four rows' contributions u2_q s_q (s_q = x_qj^2), added in row order: four
// dependent multiply-adds per column (the columns are independent, so their latency overlaps),
// two operations fewer per four rows than a tree of products. Both kernels add columns through it.
inline float add_rows4(float col, const float* u2, float s0, float s1, float s2, float s3) {
  return mul_add(u2[3], s3, mul_add(u2[2], s2, mul_add(u2[1], s1, mul_add(u2[0], s0, col))));
}

// sums[j] = add_rows4(sums[j], u2, x_0j^2, ..., x_3j^2) for a group of four rows x of G (g + q n), in
// the passes' order (pair order for BF16). The one-core kernel squares the group's rows again here
// (they are in L1, just read by row_group_sum_store) rather than storing their squares: a stored
// FP32 square is a 64-byte store per 16 values, and a 512-bit store takes two cycles on Zen 4; for
// rows of 1,376 columns the squares of two groups did not fit in L1 either. llama_60m's 56 matrices
// (sinkgd_update_many, same process, alternating, 6 runs of 12 rounds): the median ratio to Adam
// on the same matrices 1.08-1.22 -> 1.05-1.15, lower in 5 runs of 6; llama_130m's 84: 1.33 -> 1.07.
inline void add_group_columns(float* sums, const float* g, int64_t n, const float* u2) {
  const float *x0 = g, *x1 = g + n, *x2 = g + 2 * n, *x3 = g + 3 * n;
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) sums[j] = add_rows4(sums[j], u2, x0[j] * x0[j], x1[j] * x1[j], x2[j] * x2[j], x3[j] * x3[j]);
}
#pragma GCC diagnostic push  // GCC bug 105593, as above
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
inline void add_group_columns(float* sums, const bf16* g, int64_t n, const float* u2) {
  int64_t j = 0;
#if defined(__AVX512F__)
  const __m512i high_halves = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  const __m512 u[kRowGroup] = {_mm512_set1_ps(u2[0]), _mm512_set1_ps(u2[1]), _mm512_set1_ps(u2[2]), _mm512_set1_ps(u2[3])};
  for (; j + kPairBlock <= n; j += kPairBlock) {  // a block's even columns into sums[j..j+16), odd ones after
    __m512 even = _mm512_loadu_ps(sums + j), odd = _mm512_loadu_ps(sums + j + 16);
    for (int64_t q = 0; q < kRowGroup; ++q) {
      const __m512i w = _mm512_loadu_si512(g + q * n + j);
      const __m512 e = _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
      const __m512 o = _mm512_castsi512_ps(_mm512_and_si512(w, high_halves));
      even = _mm512_fmadd_ps(u[q], _mm512_mul_ps(e, e), even);
      odd = _mm512_fmadd_ps(u[q], _mm512_mul_ps(o, o), odd);
    }
    _mm512_storeu_ps(sums + j, even);
    _mm512_storeu_ps(sums + j + 16, odd);
  }
#else
  for (; j + kPairBlock <= n; j += kPairBlock) {
    float x[kRowGroup][kPairBlock];
    for (int64_t q = 0; q < kRowGroup; ++q) widen_pair_block(g + q * n + j, x[q]);
#pragma omp simd
    for (int64_t k = 0; k < kPairBlock; ++k)
      sums[j + k] = add_rows4(sums[j + k], u2, x[0][k] * x[0][k], x[1][k] * x[1][k], x[2][k] * x[2][k], x[3][k] * x[3][k]);
  }
#endif
  for (; j < n; ++j) {  // the columns after the last whole pair block keep their place
    float x[kRowGroup];
    for (int64_t q = 0; q < kRowGroup; ++q) x[q] = to_f32(g[q * n + j]);
    sums[j] = add_rows4(sums[j], u2, x[0] * x[0], x[1] * x[1], x[2] * x[2], x[3] * x[3]);
  }
}
#pragma GCC diagnostic pop

// Row g in FP32 (widened into `row` when BF16).
inline const float* row_f32(const bf16* g, int64_t n, float* row) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) row[j] = to_f32(g[j]);
  return row;
}
inline const float* row_f32(const float* g, int64_t, float*) { return g; }

// The new W value before rounding: keep w - (lu x) v, the subtraction fused with keep w where the
// target has FMA (mul_add), as write_bf16_row's vectors compute it.
inline float new_weight(float w, float x, float v, float keep, float lu) { return mul_add(w, keep, -((lu * x) * v)); }

#if defined(__AVX512BF16__)
// GCC 12 reports the intrinsics' own _mm512_undefined_* placeholders as uninitialised (bug 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// 16 values of a row (BF16 or FP32) as FP32.
inline __m512 load16_f32(const bf16* x) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x))), 16));
}
inline __m512 load16_f32(const float* x) { return _mm512_loadu_ps(x); }

// A BF16 row of W <- new_weight(...), 32 values at a time in registers, rounded by VCVTNE2PS2BF16 as
// round_row_to_bf16 does (store_bf16x32: a block holding a denormal value rounded element by element):
// the same bits as computing the row in FP32 and rounding it, without storing and reloading the
// FP32 row (two 64-byte stores and loads per 32 values; a 512-bit store takes two cycles on Zen 4).
template <class X>
inline void write_bf16_row(bf16* wi, const X* x, const float* v, int64_t n, float keep, float lu) {
  const __m512 keep_v = _mm512_set1_ps(keep), lu_v = _mm512_set1_ps(lu);
  int64_t j = 0;
  for (; j + 32 <= n; j += 32) {
    const __m512 t_lo = _mm512_mul_ps(_mm512_mul_ps(lu_v, load16_f32(x + j)), _mm512_loadu_ps(v + j));
    const __m512 t_hi = _mm512_mul_ps(_mm512_mul_ps(lu_v, load16_f32(x + j + 16)), _mm512_loadu_ps(v + j + 16));
    const __m512 lo = _mm512_fmsub_ps(load16_f32(wi + j), keep_v, t_lo);
    const __m512 hi = _mm512_fmsub_ps(load16_f32(wi + j + 16), keep_v, t_hi);
    store_bf16x32(lo, hi, wi + j);
  }
  for (; j < n; ++j) wi[j] = to_bf16(new_weight(to_f32(wi[j]), to_f32(x[j]), v[j], keep, lu));
}
#pragma GCC diagnostic pop
#endif

// Row i of W <- keep W - lu x v (lu = lr u_i; x the row of G, FP32 or BF16), rounded per a.write;
// both kernels' W write, so they round alike. A BF16 row is computed into `row` (n floats, in L1)
// and rounded by round_row_to_bf16 where the build has no AVX512-BF16 (write_bf16_row otherwise).
template <class T, class X>
inline void write_row(T* wi, const X* x, const float* v, int64_t i, int64_t n, float keep, float lu, const SinkGDArgs& a,
                      float* row) {
  if (a.write.stochastic) {  // hashes per element
    for (int64_t j = 0; j < n; ++j)
      wi[j] = write_weight<T>(new_weight(to_f32(wi[j]), to_f32(x[j]), v[j], keep, lu), a.write, static_cast<uint64_t>(i * n + j));
  } else if constexpr (std::is_same_v<T, float>) {
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) wi[j] = new_weight(wi[j], to_f32(x[j]), v[j], keep, lu);
  } else {
#if defined(__AVX512BF16__)
    (void)row;
    write_bf16_row(wi, x, v, n, keep, lu);
#else
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) row[j] = new_weight(to_f32(wi[j]), to_f32(x[j]), v[j], keep, lu);
    round_row_to_bf16(row, wi, n);
#endif
  }
}
}  // namespace

bool sinkgd_caches_rows(int64_t m, int64_t n, int threads) {
  // Each thread's rows (FP32) in three quarters of its L2, the rest for W's rows and G in flight.
  return m * n * static_cast<int64_t>(sizeof(float)) <= static_cast<int64_t>(std::max(threads, 1)) * l2_bytes() * 3 / 4;
}

// Three quarters of the larger of a core's L2 and its share of the L3. The passes after the first
// read G from L3 nearly as fast as from L2 (Zen 4, one core, one pass over a 1376 x 512 BF16 G: 0.079
// ns per element from L3, 0.073 for 512 x 512 from L2), and on one core they need no barrier; with
// all cores on one G that fits none of their L2s, each pass ended on a barrier and read G from L3
// anyway. On the 2-core Zen 4 (1 MB L2, 32 MB L3), sinkgd_update_many with every matrix one-core
// against the L2 rule, same process, alternating, best of 15: llama_60m's 56 matrices 12.7 vs 14.4
// ms, llama_130m's 84 (768 x 2048 MLPs, 3 MB) 45.6 vs 66.5 ms.
// The fair-share rule: one 1376 x 512 BF16 G alone on two threads took 0.46 ms on one core, 0.29 ms
// row-split.
int64_t sinkgd_one_core_bytes(int threads) { return std::max(l2_bytes(), l3_bytes() / std::max(threads, 1)) * 3 / 4; }

bool sinkgd_runs_one_core(int64_t m, int64_t n, int64_t g_bytes, int64_t total, int threads, int64_t one_core_bytes) {
  const int64_t bytes = m * n * g_bytes;
  if (bytes > (one_core_bytes > 0 ? one_core_bytes : sinkgd_one_core_bytes(threads))) return false;
  return bytes <= l2_bytes() * 3 / 4 || m * n * std::max(threads, 1) <= total;
}

template <class T, class G>
void sinkgd_update(T* w, const G* g, int64_t m, int64_t n, const SinkGDArgs& a, Workspace& ws, SinkgdRows mode) {
  constexpr bool widen = !std::is_same_v<G, float>;
  const int threads = omp_get_max_threads();
  // (With no pass, L = 0, nothing fills the cache: the W write reads G, with u = v = 1.)
  const bool cached = widen && a.iterations > 0 &&
                      (mode == SinkgdRows::kCached || (mode == SinkgdRows::kAuto && sinkgd_caches_rows(m, n, threads)));
  float* u = ws.floats(m, kU);
  if (a.iterations == 0) std::fill(u, u + m, 1.0f);
  // Each thread keeps its own v and v^2 and adds the chunks' column sums itself (the same adds in
  // the same order, so the same bits everywhere): one barrier per iteration instead of two. The
  // partial sums are double-buffered, so a thread may start the next iteration's rows while another
  // still reads this one's sums.
  float* scales = ws.floats(static_cast<size_t>(threads) * 2 * n, kScales);
  // Fewer, larger chunks than 64 fixed ones: fewer partial rows to add, most written by another core.
  const int64_t chunks = sinkgd_chunks(m);
  float* partials = ws.floats(2 * chunks * n, kPartial);
  float* rows = ws.floats(static_cast<size_t>(threads) * kRowGroup * n, kRows);  // a row group per thread
  float* cache = cached ? ws.floats(m * n, kCache) : nullptr;
  const float sqrt_n = std::sqrt(static_cast<float>(n)), sqrt_m = std::sqrt(static_cast<float>(m));
  const int64_t rows_per_chunk = (m + chunks - 1) / chunks;
  const float keep = 1.0f - a.lr * a.decoupled_decay;
  // One parallel region per tensor: a fork/join per pass cost as much as the passes themselves on
  // small tensors.
#pragma omp parallel
  {
    const int t = omp_get_thread_num();
    float* buf = rows + static_cast<size_t>(t) * kRowGroup * n;
    float* v = scales + static_cast<size_t>(t) * 2 * n;
    float* v2 = v + n;
    std::fill(v, v + 2 * n, 1.0f);
    for (int it = 0; it < a.iterations; ++it) {
      const bool fill = widen && (!cached || it == 0);  // widen G's rows this iteration
      float* partial = partials + (it & 1) * chunks * n;
      // Where a BF16 row i is widened: its cached row, or row q of the thread's buffer; and row i in
      // FP32 as the passes read it (an FP32 G in place).
      auto widened = [&](int64_t i, int64_t q) { return cached ? cache + i * n : buf + q * n; };
      auto row = [&](int64_t i, int64_t q) -> const float* {
        if constexpr (widen) return widened(i, q);
        else return g + i * n;
      };
#pragma omp for schedule(static)
      for (int64_t c = 0; c < chunks; ++c) {
        float* col = partial + c * n;
        std::fill(col, col + n, 0.0f);
        const int64_t end = std::min(m, (c + 1) * rows_per_chunk);
        // Rows in groups of four: their sums share v2's loads, and their column contributions go into
        // `col` in one pass (one load and store of col per four rows; the adds' order is fixed by m).
        int64_t i = c * rows_per_chunk;
        for (; i + kRowGroup <= end; i += kRowGroup) {
          const float* x[kRowGroup];
          float r[kRowGroup], u2[kRowGroup];
          for (int64_t q = 0; q < kRowGroup; ++q) x[q] = row(i + q, q);
          if (fill) row_group_sum_store<Keep::kValues>(g + i * n, v2, n, widened(i, 0), r);
          else row_sums<kRowGroup>(x, v2, n, r);
          for (int64_t q = 0; q < kRowGroup; ++q) {
            u[i + q] = sqrt_n / std::max(std::sqrt(r[q]), a.eps);
            u2[q] = u[i + q] * u[i + q];
          }
          add_group_columns(col, x[0], n, u2);  // the group's rows lie n floats apart (row(i + q, q))
        }
        for (; i < end; ++i) {  // the chunk's last rows, one at a time (the same per-row arithmetic)
          const float* x = row(i, 0);
          float r;
          if (fill) r = row_sum_store<Keep::kValues>(g + i * n, v2, n, widened(i, 0));
          else row_sums<1>(&x, v2, n, &r);
          u[i] = sqrt_n / std::max(std::sqrt(r), a.eps);
          const float u2 = u[i] * u[i];
#pragma omp simd
          for (int64_t j = 0; j < n; ++j) col[j] = mul_add(u2, x[j] * x[j], col[j]);
        }
      }  // the iteration's one barrier: every chunk's sums are in `partial`
      // v_j from the chunks' column sums, added in chunk order (0 + p0 + p1 + ...: deterministic).
      // Blocks of columns, chunk rows streamed: the chunks lie n floats apart, and walking them
      // column by column would hit one L1 set 64 times per column.
      for (int64_t j0 = 0; j0 < n; j0 += kColumnBlock) {
        const int64_t j1 = std::min(n, j0 + kColumnBlock);
        std::copy(partial + j0, partial + j1, v + j0);
        for (int64_t c = 1; c < chunks; ++c) {
          const float* p = partial + c * n;
#pragma omp simd
          for (int64_t j = j0; j < j1; ++j) v[j] += p[j];
        }
#pragma omp simd
        for (int64_t j = j0; j < j1; ++j) {
          v[j] = sqrt_m / std::max(std::sqrt(v[j]), a.eps);
          v2[j] = v[j] * v[j];
        }
      }
    }
    // W <- keep W - lr u_i x_ij v_j, in column order. Rows split as the chunks were, so a thread reads
    // the rows it cached. The thread's buffer holds a row of G in column order in its first n
    // floats, W's new row in the next n.
    const float* v_columns = v;
    if constexpr (kPaired<G>) {
      column_order(v, n, v2);  // v^2 is no longer needed
      v_columns = v2;
    }
    auto g_row = [&](int64_t i) -> const float* {
      if (!cached) return row_f32(g + i * n, n, buf);
      column_order(cache + i * n, n, buf);
      return buf;
    };
#pragma omp for schedule(static)
    for (int64_t c = 0; c < chunks; ++c)
      for (int64_t i = c * rows_per_chunk; i < std::min(m, (c + 1) * rows_per_chunk); ++i)
        write_row(w + i * n, g_row(i), v_columns, i, n, keep, a.lr * u[i], a, buf + n);
  }
}

// (weights, gradients): FP32/FP32, BF16/BF16 (the paper), BF16 weights with an FP32 gradient arena.
template void sinkgd_update<float, float>(float*, const float*, int64_t, int64_t, const SinkGDArgs&, Workspace&, SinkgdRows);
template void sinkgd_update<bf16, bf16>(bf16*, const bf16*, int64_t, int64_t, const SinkGDArgs&, Workspace&, SinkgdRows);
template void sinkgd_update<bf16, float>(bf16*, const float*, int64_t, int64_t, const SinkGDArgs&, Workspace&, SinkgdRows);
// FP32 weights with a BF16 gradient: no model stores that pair; tests read the update unrounded.
template void sinkgd_update<float, bf16>(float*, const bf16*, int64_t, int64_t, const SinkGDArgs&, Workspace&, SinkgdRows);

// ---- Many tensors: each whole on one core ---------------------------------------------------------
// sinkgd_update's arithmetic in its order, on one thread: a chunk's column sums are added into v as
// the chunk completes, in chunk order (0 + p0 + p1 + ...), and each row's sum uses the same lanes
// and tree, so the bits equal the row-split kernel's (tests: SinkGD.ManyTensorsEqualOneByOne).
// G fits the core's cache budget (sinkgd_one_core_bytes): the first pass reads it from memory, the
// later passes and the W write from L2 (or L3), with no widened copy. A row group's column adds
// square its rows again (add_group_columns). No barrier and no partial sums shared between cores;
// and while one core runs a tensor's passes out of its L2, the other streams another tensor's G and
// W from memory, so the step is no longer the sum of a memory-bound and a cache-bound part.
// Scratch: u (m), v (n), v^2 (n), a chunk's column sums (n), one row (n: a chunk's last rows'
// squares, and the W write's FP32 row), each region on a cache line.
namespace {
// Not inlined into the parallel loop: inlined there, GCC kept the column adds' row pointers on the
// stack and reloaded them every vector (perf annotate).
template <class T, class G>
[[gnu::noinline]] void sinkgd_update_one_core(T* w, const G* g, int64_t m, int64_t n, const SinkGDArgs& a, float* scratch) {
  // Each region on a cache line (cache_line_floats), so their vector loads and stores never straddle two.
  float* u = scratch;
  float* v = u + cache_line_floats(m);
  float* v2 = v + cache_line_floats(n);
  float* col = v2 + cache_line_floats(n);
  float* row = col + cache_line_floats(n);
  const int64_t chunks = sinkgd_chunks(m), rows_per_chunk = (m + chunks - 1) / chunks;
  const float sqrt_n = std::sqrt(static_cast<float>(n)), sqrt_m = std::sqrt(static_cast<float>(m));
  const float keep = 1.0f - a.lr * a.decoupled_decay;
  std::fill(v, v + n, 1.0f);
  std::fill(v2, v2 + n, 1.0f);
  if (a.iterations == 0) std::fill(u, u + m, 1.0f);  // no pass: W <- keep W - lr G
  for (int it = 0; it < a.iterations; ++it) {
    for (int64_t c = 0; c < chunks; ++c) {
      float* sums = c == 0 ? v : col;  // chunk 0's sums start v; the others are added to it below
      std::fill(sums, sums + n, 0.0f);
      const int64_t end = std::min(m, (c + 1) * rows_per_chunk);
      int64_t i = c * rows_per_chunk;
      for (; i + kRowGroup <= end; i += kRowGroup) {
        float r[kRowGroup], u2[kRowGroup];
        row_group_sum_store<Keep::kNothing>(g + i * n, v2, n, nullptr, r);
#pragma omp simd
        for (int64_t q = 0; q < kRowGroup; ++q) {
          u[i + q] = sqrt_n / std::max(std::sqrt(r[q]), a.eps);
          u2[q] = u[i + q] * u[i + q];
        }
        add_group_columns(sums, g + i * n, n, u2);
      }
      for (; i < end; ++i) {
        const float r = row_sum_store<Keep::kSquares>(g + i * n, v2, n, row);
        u[i] = sqrt_n / std::max(std::sqrt(r), a.eps);
        const float u2 = u[i] * u[i];
#pragma omp simd
        for (int64_t j = 0; j < n; ++j) sums[j] = mul_add(u2, row[j], sums[j]);
      }
      if (c > 0) {
#pragma omp simd
        for (int64_t j = 0; j < n; ++j) v[j] += col[j];
      }
    }
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) {
      v[j] = sqrt_m / std::max(std::sqrt(v[j]), a.eps);
      v2[j] = v[j] * v[j];
    }
  }
  const float* v_columns = v;
  if constexpr (kPaired<G>) {
    column_order(v, n, col);
    v_columns = col;
  }
  // G from L2; W from memory, each row's lines asked for (into L2) kWritePrefetchBytes ahead.
  const uintptr_t w_end = reinterpret_cast<uintptr_t>(w + m * n);
  for (int64_t i = 0; i < m; ++i) {
    const uintptr_t row_end = std::min(reinterpret_cast<uintptr_t>(w + (i + 1) * n) + kWritePrefetchBytes, w_end);
    for (uintptr_t p = reinterpret_cast<uintptr_t>(w + i * n); p + kWritePrefetchBytes < row_end; p += 64)
      prefetch_to_l2(reinterpret_cast<const void*>(p), kWritePrefetchBytes);
    write_row(w + i * n, g + i * n, v_columns, i, n, keep, a.lr * u[i], a, row);
  }
}
}  // namespace

int64_t sinkgd_one_core_floats(int64_t m, int64_t n) { return cache_line_floats(m) + 4 * cache_line_floats(n); }

void sinkgd_update_many(const SinkGDTensor* tensors, int64_t count, const SinkGDArgs& args, Workspace& ws,
                        int64_t one_core_bytes) {
  auto with_types = [](const SinkGDTensor& t, auto&& fn) { dispatch::with_types<bf16>(t.w.dtype, t.g.dtype, "sinkgd_update_many", fn); };
  const int threads = omp_get_max_threads();
  int64_t total = 0;
  for (int64_t i = 0; i < count; ++i) total += tensors[i].m * tensors[i].n;
  auto fits = [&](const SinkGDTensor& t) {
    return sinkgd_runs_one_core(t.m, t.n, dtype_bytes(t.g.dtype), total, threads, one_core_bytes);
  };
  auto args_of = [&](const SinkGDTensor& t) {
    SinkGDArgs a = args;
    a.write.tensor = t.tensor;
    return a;
  };
  // The tensors that fit one core, largest first (the dynamic schedule below then ends on small ones).
  int32_t* order = ws.ints(static_cast<size_t>(count));
  int64_t one_core = 0, per_thread = 0;
  for (int64_t i = 0; i < count; ++i) {
    with_types(tensors[i], [](auto*, auto*) {});  // an unsupported dtype pair throws here, not in a thread
    if (!fits(tensors[i])) continue;
    order[one_core++] = static_cast<int32_t>(i);
    per_thread = std::max(per_thread, sinkgd_one_core_floats(tensors[i].m, tensors[i].n));
  }
  std::sort(order, order + one_core, [&](int32_t a, int32_t b) {
    const int64_t na = tensors[a].m * tensors[a].n, nb = tensors[b].m * tensors[b].n;
    return na != nb ? na > nb : a < b;
  });
  if (one_core > 0) {
    float* scratch = ws.floats(static_cast<size_t>(threads) * per_thread, kSinkgdOneCoreSlot);
#pragma omp parallel
    {
      float* mine = scratch + static_cast<size_t>(omp_get_thread_num()) * per_thread;
#pragma omp for schedule(dynamic, 1)
      for (int64_t k = 0; k < one_core; ++k) {
        const SinkGDTensor& t = tensors[order[k]];
        with_types(t, [&](auto* wt, auto* gt) {
          using T = std::remove_pointer_t<decltype(wt)>;
          using G = std::remove_pointer_t<decltype(gt)>;
          sinkgd_update_one_core(static_cast<T*>(t.w.ptr), static_cast<const G*>(t.g.ptr), t.m, t.n, args_of(t), mine);
        });
      }
    }
  }
  for (int64_t i = 0; i < count; ++i) {  // the rest row-split over all cores, one after another
    const SinkGDTensor& t = tensors[i];
    if (fits(t)) continue;
    with_types(t, [&](auto* wt, auto* gt) {
      using T = std::remove_pointer_t<decltype(wt)>;
      using G = std::remove_pointer_t<decltype(gt)>;
      sinkgd_update(static_cast<T*>(t.w.ptr), static_cast<const G*>(t.g.ptr), t.m, t.n, args_of(t), ws);
    });
  }
}

}  // namespace multinorm::cpu
