// SinkGD on W, G [m, n], fused (the algorithm and its CPU twin: kernels/cpu/sinkgd.cpp), for many
// tensors at once: each pass is one launch over every tensor of the call (2 L + 1 launches in all,
// where one tensor at a time took 2 L + 2 per tensor: llama_60m's 56 matrices, L = 5, 672 -> 11).
//   X = diag(u) G diag(v) is never materialised; each of the L iterations is one rows launch over G:
//   a block owns a fixed chunk of one tensor's rows (cuda_scratch::sinkgd_chunks(m): the same reduction tree on
//   every GPU), taken by groups of threads sized to the row (a 512-wide BF16 row: 64 threads, 4 rows
//   at a time); for each row its group reduces ||G_i o v||, sets u_i = sqrt(n) / max(norm, eps), and
//   adds u_i^2 G_ij^2 to the group's column partial in shared memory (each thread owns its columns,
//   P at a time, sinkgd_rows: no races, no atomics), the groups' partials added in group order; a
//   columns launch sums each tensor's partials in chunk order into
//   v_j = sqrt(m) / max(., eps). The first pass takes v = 1 without reading it. The last launch reads
//   G and W once and writes W.
// Bytes: L x (|G| + chunks n 4 x 2) + |G| + 2 |W|; with BF16 G and W that is 2L + 6 bytes per element
// (L = 5: 16 B/element) against Adam's 12 (BF16 w, g, m, v read; w, m, v written) — and no state.
// A row is read once where a thread owns at most three packs of it (sinkgd_rows_registers: every
// llama_1b matrix in BF16), else its second read (for the column partial) hits L1. The rows pass
// reads G 16 bytes per thread (LDG.128) where the rows start on 16 bytes (base and stride), a row's
// last pack masked where n is not whole packs (llama_1b's 5461-wide down projection in its 128-byte
// arena rows); dense rows off 16 bytes as the aligned packs that hold each row
// (sinkgd_rows_spanning). The W write moves W and G in 16-byte packs where the rows start on 16
// bytes (a row's last pack masked), else element by element.
// A block finds its tensor by a binary search of the launch's descriptors (at most kSinkgdManyPerLaunch, in L2).
#include <cmath>

#include "device_utils.cuh"
#include "kernels.h"
#include "multinorm/cuda_scratch.h"

namespace multinorm::cuda {

namespace {

constexpr int kThreads = cuda_scratch::kSinkgdThreads;
constexpr int64_t kApplyElementsPerBlock = 4096;

// The item whose range of one pass's blocks (starting at first(item), non-decreasing) holds `block`:
// the last item starting at or before it, by binary search over the launch's descriptors.
template <class First>
__device__ int64_t item_of_block(const SinkgdManyItem* items, int64_t count, int64_t block, First first) {
  int64_t lo = 0, hi = count - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (first(items[mid]) <= block) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// Where column j's partial sits in a group's [n] partial. Runs of 8 (BF16 packs) are split into two
// halves of 4 kept n/2 apart, so a warp's 16-byte partial updates fall 16 bytes apart (one bank
// wavefront per quarter-warp), not 32 (two). Rows that are not whole packs (a masked last pack:
// llama_1b's 5461 columns) keep the plain order, updated element by element.
__device__ __forceinline__ int64_t partial_index(int64_t j, int64_t n, int P) {
  if (P != 8 || n % 8 != 0) return j;
  const int64_t k = j % 8;
  return (k < 4 ? 0 : n / 2) + j / 8 * 4 + k % 4;
}

// Called by every thread of the block once a round (its barrier): the round's row norms from the
// threads' partial sums r (warp sums into the round's half of scratch, a group's warps added in warp
// order), u_i = sqrt(n) / max(norm, eps) for a live row (written by its group's first thread), and
// u_i^2 returned (0 for a group past the chunk's rows).
__device__ __forceinline__ float row_scale_squared(float r, float* scratch, int half, int group, int group_warps, int gt, bool live, int64_t i,
                                                   float* u, float sqrt_n, float eps) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  r = warp_sum(r);
  if (lane == 0) scratch[32 * half + warp] = r;
  __syncthreads();
  if (!live) return 0.0f;
  r = 0.0f;
  for (int w = 0; w < group_warps; ++w) r += scratch[32 * half + group * group_warps + w];
  const float ui = sqrt_n / fmaxf(sqrtf(r), eps);
  if (gt == 0) u[i] = ui;
  return ui * ui;
}

// R rows' scales at once, one barrier for all (the rows of a round: first_row + q row_step, q < R):
// each row's norm from its group's warp sums added in warp order, as row_scale_squared, so the same
// bits; r[q] becomes u_i^2 (0 for a row past the chunk).
template <int R>
__device__ __forceinline__ void rows_scales_squared(float (&r)[R], float* scratch, int half, int group, int group_warps, int gt, int64_t first_row,
                                                   int64_t row_step, int64_t end, float* u, float sqrt_n, float eps) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  float* s = scratch + half * R * warps;
#pragma unroll
  for (int q = 0; q < R; ++q) {
    const float w = warp_sum(r[q]);
    if (lane == 0) s[q * warps + warp] = w;
  }
  __syncthreads();
#pragma unroll
  for (int q = 0; q < R; ++q) {
    const int64_t i = first_row + q * row_step;
    float t = 0.0f;
    for (int w = 0; w < group_warps; ++w) t += s[q * warps + group * group_warps + w];
    const float ui = sqrt_n / fmaxf(sqrtf(t), eps);
    if (gt == 0 && i < end) u[i] = ui;
    r[q] = i < end ? ui * ui : 0.0f;
  }
}

// The pack of a row at column j, its values past column n zero (a row's last pack where n is not a
// whole number of packs: a tensor whose rows are ld elements apart spans m ld of them, as a padded
// arena tensor does, so the whole pack is inside its row's stride).
template <class G>
__device__ __forceinline__ Pack<G> load_row_pack(const G* gi, int64_t j, int64_t n) {
  constexpr int P = Pack<G>::kSize;
  Pack<G> pk = *reinterpret_cast<const Pack<G>*>(gi + j);
  if (j + P > n)
#pragma unroll
    for (int p = 0; p < P; ++p)
      if (j + p >= n) pk.v[p] = from_float<G>(0.0f);
  return pk;
}

// One row pass over rows begin..end-1 of one tensor: u from v, and the chunk's column partial of
// u^2 G^2. Groups of S threads (cuda_scratch::sinkgd_row_threads) take blockDim / S rows at a time, each group with
// its own column partial in shared memory (col + group n): thread t of a group owns columns
// P t + P S k .. + P - 1, reading G 16 bytes at a time (P: a pack; a row's last pack masked where n
// is not a whole number of packs). A row's norm is its group's warp sums added in warp order after
// one barrier a round (the round's scratch half alternates, so no second barrier). The caller adds
// the groups' partials in group order. For rows wider than sinkgd_rows_registers takes.
template <class G, int P>
__device__ void sinkgd_rows(const G* g, float* u, const float* v, float* col, float* scratch, int64_t begin, int64_t end, int64_t n, int64_t ld,
                            bool first_pass, float sqrt_n, float eps, int S) {
  const int group = threadIdx.x / S, gt = threadIdx.x % S, groups = blockDim.x / S;
  const int group_warps = S / 32;
  float* colg = col + int64_t(group) * n;
  const int64_t stride = int64_t(P) * S;
  const bool whole_packs = n % P == 0;
  int half = 0;
  for (int64_t r0 = begin; r0 < end; r0 += groups, half ^= 1) {
    const int64_t i = r0 + group;
    const bool live = i < end;  // group-uniform: a group past the chunk's last row still meets the barrier
    const G* gi = g + i * ld;
    float r = 0.0f;
    for (int64_t j = int64_t(P) * gt; live && j < n; j += stride) {
      const Pack<G> x = load_row_pack(gi, j, n);
#pragma unroll
      for (int p = 0; p < P; ++p) {
        const float xp = to_float(x.v[p]);
        const float y = first_pass ? xp : xp * (j + p < n ? v[j + p] : 1.0f);  // v = 1 before the first pass
        r += y * y;
      }
    }
    const float u2 = row_scale_squared(r, scratch, half, group, group_warps, gt, live, i, u, sqrt_n, eps);
    if (!live) continue;
    for (int64_t j = int64_t(P) * gt; j < n; j += stride) {
      const Pack<G> x = load_row_pack(gi, j, n);
      if (!whole_packs) {
        for (int p = 0; p < P && j + p < n; ++p) colg[j + p] += u2 * to_float(x.v[p]) * to_float(x.v[p]);
        continue;
      }
#pragma unroll
      for (int q = 0; q < P; q += 4) {
        Pack<float>& c = *reinterpret_cast<Pack<float>*>(colg + partial_index(j + q, n, P));
#pragma unroll
        for (int p = 0; p < 4; ++p) c.v[p] += u2 * to_float(x.v[q + p]) * to_float(x.v[q + p]);
      }
    }
  }
}

// sinkgd_rows where a thread owns at most K packs of a row (n <= K P S: llama_1b's 2048-wide BF16
// matrices at K = 1, its 5461-wide down projection at K = 3): its columns' v and partial sums stay in
// registers over the chunk's rows, each row is read once, R rows a round are loaded together (K R
// packs a thread in flight: 8, 4, 6 for K = 1, 2, 3, as many as 128 registers hold without spilling)
// and share one barrier, and the partials reach shared memory once, at the end. The same sums as
// sinkgd_rows (a thread's columns in order, its group's rows in order), so the same bits. Why
// registers: sinkgd_rows reads 32 bytes of v and updates 32 bytes of shared partial per 16 bytes of
// G. Measured itself (H200, 2026-11-28): DRAM at 23%, held by its 128 registers (2 blocks an SM) and
// a barrier a round; docs/cuda.md has the two-pass design meant to replace it.
template <class G, int K, int R>
__device__ void sinkgd_rows_registers(const G* g, float* u, const float* v, float* col, float* scratch, int64_t begin, int64_t end, int64_t n,
                                      int64_t ld, bool first_pass, float sqrt_n, float eps, int S) {
  constexpr int P = Pack<G>::kSize;
  const int group = threadIdx.x / S, gt = threadIdx.x % S, groups = blockDim.x / S;
  const int group_warps = S / 32, width = static_cast<int>(n);  // n fits a block's shared partial: an int
  float vj[K][P], acc[K][P];
#pragma unroll
  for (int k = 0; k < K; ++k)
#pragma unroll
    for (int p = 0; p < P; ++p) {
      const int j = P * (gt + k * S) + p;
      vj[k][p] = first_pass || j >= width ? 1.0f : v[j], acc[k][p] = 0.0f;  // v = 1 before the first pass
    }
  const int64_t row_step = int64_t(groups) * ld;
  int half = 0;
  for (int64_t r0 = begin; r0 < end; r0 += int64_t(groups) * R, half ^= 1) {
    const G* row = g + (r0 + group) * ld;
    const int rows = static_cast<int>((end - r0 - group + groups - 1) / groups);  // this group's live rows from r0 (may exceed R)
    Pack<G> x[R][K];
#pragma unroll
    for (int q = 0; q < R; ++q)
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const int j = P * (gt + k * S);
        if (q < rows && j < width) x[q][k] = load_row_pack(row + q * row_step, j, n);
        else
#pragma unroll
          for (int p = 0; p < P; ++p) x[q][k].v[p] = from_float<G>(0.0f);
      }
    float r[R];
#pragma unroll
    for (int q = 0; q < R; ++q) {
      r[q] = 0.0f;
#pragma unroll
      for (int k = 0; k < K; ++k)
#pragma unroll
        for (int p = 0; p < P; ++p) {
          const float y = to_float(x[q][k].v[p]) * vj[k][p];
          r[q] += y * y;
        }
    }
    rows_scales_squared<R>(r, scratch, half, group, group_warps, gt, r0 + group, groups, end, u, sqrt_n, eps);
#pragma unroll
    for (int q = 0; q < R; ++q)
      if (q < rows)  // group-uniform
#pragma unroll
        for (int k = 0; k < K; ++k)
#pragma unroll
          for (int p = 0; p < P; ++p) acc[k][p] += r[q] * to_float(x[q][k].v[p]) * to_float(x[q][k].v[p]);
  }
  float* colg = col + int64_t(group) * n;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int j = P * (gt + k * S);
    if (j >= width) continue;
    if (width % P != 0) {
      for (int p = 0; p < P && j + p < width; ++p) colg[j + p] = acc[k][p];
      continue;
    }
#pragma unroll
    for (int q = 0; q < P; q += 4) {
      Pack<float>& c = *reinterpret_cast<Pack<float>*>(colg + partial_index(j + q, n, P));
#pragma unroll
      for (int p = 0; p < 4; ++p) c.v[p] = acc[k][q + p];
    }
  }
}

// The row pass where rows do not all start on 16 bytes (a dense row stride off 16 bytes: 5461
// BF16 columns outside a padded arena, or a base off 16 bytes): a row is read as the aligned packs that hold it, thread
// gt of a group taking packs gt, gt + S, ..., the elements outside the row masked, so G moves 16
// bytes a load as in the packed path (element by element only where a pack reaches past the
// tensor). A column's owner changes from row to row; the round's barrier orders its partial's
// updates. Sums as in sinkgd_rows: a thread's values in column order, its group's warps in order.
template <class G>
__device__ void sinkgd_rows_spanning(const G* g, float* u, const float* v, float* col, float* scratch, int64_t begin, int64_t end, int64_t m,
                                     int64_t n, int64_t ld, bool first_pass, float sqrt_n, float eps, int S) {
  constexpr int P = Pack<G>::kSize;
  const int group = threadIdx.x / S, gt = threadIdx.x % S, groups = blockDim.x / S;
  const int group_warps = S / 32;
  float* colg = col + int64_t(group) * n;
  // Elements counted from the aligned pack at or below g: the tensor is [shift, shift + (m - 1) ld + n).
  const int64_t shift = int64_t(reinterpret_cast<uintptr_t>(g) % 16 / sizeof(G)), total = shift + (m - 1) * ld + n;
  const G* base = g - shift;
  // Pack k's values (0 outside the tensor).
  auto load_pack = [&](int64_t k, float (&x)[P]) {
    const int64_t e0 = k * P;
    if (e0 >= shift && e0 + P <= total) {
      load_values<G, P>(base, e0, x);
    } else {
#pragma unroll
      for (int p = 0; p < P; ++p) x[p] = e0 + p >= shift && e0 + p < total ? to_float(base[e0 + p]) : 0.0f;
    }
  };
  int half = 0;
  for (int64_t r0 = begin; r0 < end; r0 += groups, half ^= 1) {
    const int64_t i = r0 + group;
    const bool live = i < end;  // group-uniform: a group past the chunk's last row still meets the barrier
    const int64_t row0 = shift + i * ld, first = row0 / P, last = (row0 + n - 1) / P;
    float r = 0.0f;
    for (int64_t k = first + gt; live && k <= last; k += S) {
      float x[P];
      load_pack(k, x);
#pragma unroll
      for (int p = 0; p < P; ++p) {
        const int64_t j = k * P + p - row0;
        if (j < 0 || j >= n) continue;
        const float y = first_pass ? x[p] : x[p] * v[j];  // v = 1 before the first pass
        r += y * y;
      }
    }
    const float u2 = row_scale_squared(r, scratch, half, group, group_warps, gt, live, i, u, sqrt_n, eps);
    if (!live) continue;
    for (int64_t k = first + gt; k <= last; k += S) {
      float x[P];
      load_pack(k, x);
#pragma unroll
      for (int p = 0; p < P; ++p) {
        const int64_t j = k * P + p - row0;
        if (j >= 0 && j < n) colg[j] += u2 * x[p] * x[p];
      }
    }
  }
}

// One row pass of one tensor's chunk (a block): u from v, and the chunk's column partial of u^2 G^2.
// The layout orders the tensors by kind (cuda_scratch::sinkgd_rows_kind) and each kind has a launch
// of its own, its blocks from `first_block`: one kind's registers are not another's occupancy.
template <class G, int kKind>
__global__ void MN_LAUNCH_BOUNDS(kThreads, 2) sinkgd_rows_kernel(const SinkgdManyItem* items, int64_t count, int64_t first_block, bool first_pass, float eps,
                                   const UpdateScalars* scalars) {
  if (scalars && scalars->stats.skip) return;  // a skipped update: no pass (the scratch is not read after)
  using Kind = cuda_scratch::SinkgdRows;
  constexpr bool spanning = kKind == int(Kind::Spanning), registers = kKind <= int(Kind::ThreePacks);
  constexpr int P = Pack<G>::kSize;
  MN_DYNAMIC_SHARED(float, col);
  __shared__ float scratch[2 * 8 * (kThreads / 32)];  // two halves of 8 rows' warp sums (rows_scales_squared)
  const int64_t block = first_block + int64_t(blockIdx.x);
  const SinkgdManyItem& it = items[item_of_block(items, count, block, [](const SinkgdManyItem& x) { return x.first_row_block; })];
  const G* g = static_cast<const G*>(it.g);
  const int64_t m = it.m, n = it.n, ld = it.ld, chunk = block - it.first_row_block;
  float* u = it.scratch;
  const float* v = u + m;
  float* partials = u + m + n;
  // The host's rule for the kinds too: a OnePack, TwoPacks, ThreePacks tensor's rows are at most 1, 2, 3 packs a thread.
  const int S = cuda_scratch::sinkgd_row_threads(n, P), groups = blockDim.x / S;
  const int64_t begin = chunk * it.rows_per_chunk;
  const int64_t end = begin + it.rows_per_chunk < m ? begin + it.rows_per_chunk : m;
  if constexpr (!registers) {  // these add into the partial; the registers' kernel writes every column of it
    for (int64_t j = threadIdx.x; j < groups * n; j += blockDim.x) col[j] = 0.0f;
    __syncthreads();  // a thread's columns differ between this loop and the passes below
  }
  if constexpr (spanning) sinkgd_rows_spanning<G>(g, u, v, col, scratch, begin, end, m, n, ld, first_pass, it.sqrt_n, eps, S);
  else if constexpr (kKind == int(Kind::Packed)) sinkgd_rows<G, P>(g, u, v, col, scratch, begin, end, n, ld, first_pass, it.sqrt_n, eps, S);
  else if constexpr (kKind == int(Kind::OnePack)) sinkgd_rows_registers<G, 1, 8>(g, u, v, col, scratch, begin, end, n, ld, first_pass, it.sqrt_n, eps, S);
  else if constexpr (kKind == int(Kind::TwoPacks)) sinkgd_rows_registers<G, 2, 2>(g, u, v, col, scratch, begin, end, n, ld, first_pass, it.sqrt_n, eps, S);
  else if constexpr (kKind == int(Kind::ThreePacks)) sinkgd_rows_registers<G, 3, 2>(g, u, v, col, scratch, begin, end, n, ld, first_pass, it.sqrt_n, eps, S);
  __syncthreads();
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    float s = 0.0f;
    const int64_t at = partial_index(j, n, spanning ? 1 : P);
    for (int q = 0; q < groups; ++q) s += col[int64_t(q) * n + at];  // group order: deterministic
    partials[chunk * n + j] = s;
  }
}

__global__ void sinkgd_cols_kernel(const SinkgdManyItem* items, int64_t count, float eps, const UpdateScalars* scalars) {
  if (scalars && scalars->stats.skip) return;
  const SinkgdManyItem& it = items[item_of_block(items, count, blockIdx.x, [](const SinkgdManyItem& x) { return x.first_col_block; })];
  const int64_t n = it.n, j = (int64_t(blockIdx.x) - it.first_col_block) * blockDim.x + threadIdx.x;
  if (j >= n) return;
  float* v = it.scratch + it.m;
  const float* partials = v + n;
  float s = 0.0f;
  // Chunk order (deterministic); unrolled so 16 independent loads are in flight before their adds
  // (measured on an H200: 37 us a launch against 14 predicted, each thread's loads one at a time).
#pragma unroll 16
  for (int64_t c = 0; c < it.chunks; ++c) s += partials[c * n + j];
  v[j] = it.sqrt_m / fmaxf(sqrtf(s), eps);
}

// W <- W keep - lr u_i G_ij v_j over slots begin..end-1 of one tensor (u = v = 1 when there were no
// passes): slot s is row s / width, column s % width, at i ld + j (rows of ld), P consecutive slots
// of one row per thread and step. width is n, or n rounded up to 8 where the rows are whole packs of
// stride but not of width (the padded arenas' down projection): a row's last pack is then read whole
// and written with its columns past n as they were, and slots past it are skipped. With P > 1 (P
// divides width and ld, the rows start on 16 bytes) W and G move as 16-byte packs; with P = 1,
// element by element. The rounding's index is the logical element's, i n + j, whatever ld.
template <class T, class G, int P>
__device__ void sinkgd_apply(T* w, const G* g, const float* u, const float* v, bool scaled, int64_t n, int64_t width, int64_t ld, int64_t begin,
                             int64_t end, float lr, float keep, const WriteBack& wb) {
  for (int64_t s = begin + int64_t(P) * threadIdx.x; s < end; s += int64_t(P) * blockDim.x) {
    const int64_t i = s / width, j = s - i * width, at = i * ld + j, k = i * n + j;
    if (j >= n) continue;
    const float ui = scaled ? u[i] : 1.0f;
    float wk[P], gk[P];
    load_values<T, P>(w, at, wk);
    load_values<G, P>(g, at, gk);
    T out[P];
#pragma unroll
    for (int p = 0; p < P; ++p) {
      if (P > 1 && j + p >= n) {  // past the row: the padding as it was
        out[p] = from_float<T>(wk[p]);
        continue;
      }
      const float vj = scaled ? v[j + p] : 1.0f;
      out[p] = store_weight<T>(wk[p] * keep - lr * ui * gk[p] * vj, wb, static_cast<uint64_t>(k + p));
    }
    if constexpr (P == 1) {
      w[at] = out[0];
    } else {
      constexpr int S = Pack<T>::kSize;
#pragma unroll
      for (int q = 0; q < P; q += S) {
        Pack<T> pk;
#pragma unroll
        for (int p = 0; p < S; ++p) pk.v[p] = out[q + p];
        *reinterpret_cast<Pack<T>*>(w + at + q) = pk;
      }
    }
  }
}

// A row's slots in the apply pass where its last pack is masked: n rounded up to 8 (a whole number of
// packs of either size); the layout gives every tensor blocks for that many.
MN_HOST_DEVICE int64_t sinkgd_apply_width(int64_t n) { return (n + 7) / 8 * 8; }

// The W write over one tensor's block of kApplyElementsPerBlock slots (a multiple of every P).
template <class T, class G>
__global__ void sinkgd_apply_kernel(const SinkgdManyItem* items, int64_t count, bool scaled, RuleScalars r, WriteBack wb, const UpdateScalars* s,
                                    int slot) {
  if (!take_update_scalars(s, slot, r, wb)) return;
  const float lr = r.lr, keep = r.keep;
  const SinkgdManyItem& it = items[item_of_block(items, count, blockIdx.x, [](const SinkgdManyItem& x) { return x.first_apply_block; })];
  T* w = static_cast<T*>(it.w);
  const G* g = static_cast<const G*>(it.g);
  const float* u = it.scratch;
  const float* v = u + it.m;
  wb.tensor = it.tensor;
  constexpr int P = Pack<T>::kSize > Pack<G>::kSize ? Pack<T>::kSize : Pack<G>::kSize;
  const int64_t n = it.n, begin = (int64_t(blockIdx.x) - it.first_apply_block) * kApplyElementsPerBlock;
  const bool packed_rows = packable<T>(w, it.ld) && packable<G>(g, it.ld) && it.ld % P == 0;
  const int64_t width = packed_rows && n % P != 0 ? sinkgd_apply_width(n) : n, total = it.m * width;
  const int64_t end = begin + kApplyElementsPerBlock < total ? begin + kApplyElementsPerBlock : total;
  if (packed_rows) sinkgd_apply<T, G, P>(w, g, u, v, scaled, n, width, it.ld, begin, end, lr, keep, wb);
  else sinkgd_apply<T, G, 1>(w, g, u, v, scaled, n, n, it.ld, begin, end, lr, keep, wb);
}

}  // namespace

// The rows pass's shared column partials: one row's width, or a group's for every group of a
// narrow matrix (groups x n <= kThreads x 8 floats: the widest 16-byte pack, BF16).
static int64_t rows_shared_floats(const SinkgdLayout& l) { return std::max<int64_t>(l.max_n, int64_t(kThreads) * 8); }

int64_t sinkgd_scratch(int64_t m, int64_t n) { return cuda_scratch::sinkgd_floats(m, n); }

SinkgdManyItem sinkgd_item(void* w, const void* g, int64_t m, int64_t n, int64_t ld, float* scratch, uint64_t tensor) {
  const int64_t chunks = cuda_scratch::sinkgd_chunks(m), rows_per_chunk = (m + chunks - 1) / chunks;
  SinkgdManyItem it{};
  it.w = w, it.g = g, it.scratch = scratch, it.m = m, it.n = n, it.ld = ld ? ld : n;
  it.rows_per_chunk = rows_per_chunk;
  it.chunks = (m + rows_per_chunk - 1) / rows_per_chunk;  // the chunks that hold rows
  it.tensor = tensor;
  it.sqrt_n = std::sqrt(static_cast<float>(n)), it.sqrt_m = std::sqrt(static_cast<float>(m));
  return it;
}

SinkgdLayout sinkgd_layout(SinkgdManyItem* items, int64_t count, int64_t g_bytes) {
  // The tensors by the rows pass's kind, in their order within a kind (each tensor's sums are its
  // own: the order changes no bits).
  const auto kind = [g_bytes](const SinkgdManyItem& it) {
    return static_cast<int>(cuda_scratch::sinkgd_rows_kind(reinterpret_cast<uintptr_t>(it.g), it.n, it.ld, g_bytes));
  };
  std::stable_sort(items, items + count, [&](const SinkgdManyItem& a, const SinkgdManyItem& b) { return kind(a) < kind(b); });
  SinkgdLayout l;
  int64_t row_blocks = 0;
  for (int64_t i = 0; i < count; ++i) {
    SinkgdManyItem& it = items[i];
    if (it.n > kSharedOptInFloats)
      throw_launch_error("sinkgd_rows", dim3(), dim3(), it.n * 4,
                         "a row of " + std::to_string(it.n) + " columns exceeds the " + std::to_string(kSharedOptInFloats) +
                             " of one block's shared column partial (an A100's 163 KB)");
    it.first_row_block = row_blocks, it.first_col_block = l.col_blocks, it.first_apply_block = l.apply_blocks;
    row_blocks += it.m * it.n > 0 ? it.chunks : 0;
    for (int k = kind(it) + 1; k <= cuda_scratch::kSinkgdRowsKinds; ++k) l.rows_begin[k] = row_blocks;
    l.col_blocks += ceil_div(it.n, kThreads);
    l.apply_blocks += ceil_div(it.m * sinkgd_apply_width(it.n), kApplyElementsPerBlock);  // enough for either width
    l.max_n = std::max(l.max_n, it.n);
  }
  return l;
}

// One rows launch per kind present, its blocks from the kind's first.
template <class G, int kKind = 0>
void launch_rows_passes(const SinkgdManyItem* items, int64_t count, const SinkgdLayout& l, size_t shared, bool first_pass, float eps,
                        const UpdateScalars* scalars, cudaStream_t stream) {
  if constexpr (kKind < cuda_scratch::kSinkgdRowsKinds) {
    const int64_t blocks = l.rows_begin[kKind + 1] - l.rows_begin[kKind];
    if (blocks > 0)
      launch("sinkgd_rows", sinkgd_rows_kernel<G, kKind>, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), shared, stream, items, count,
             l.rows_begin[kKind], first_pass, eps, scalars);
    launch_rows_passes<G, kKind + 1>(items, count, l, shared, first_pass, eps, scalars, stream);
  }
}

template <class T, class G>
void sinkgd_many(const SinkgdManyItem* items, int64_t count, const SinkgdLayout& l, int iterations, float eps, const RuleScalars& r,
                 const WriteBack& wb, ScalarsRef s, cudaStream_t stream) {
  if (count == 0 || l.apply_blocks == 0) return;
  const size_t shared = rows_shared_floats(l) * sizeof(float);
  for (int it = 0; it < iterations; ++it) {
    launch_rows_passes<G>(items, count, l, shared, it == 0, eps, s.at, stream);
    launch("sinkgd_cols", sinkgd_cols_kernel, dim3(static_cast<unsigned>(l.col_blocks)), dim3(kThreads), 0, stream, items, count, eps, s.at);
  }
  launch("sinkgd_apply", sinkgd_apply_kernel<T, G>, dim3(static_cast<unsigned>(l.apply_blocks)), dim3(kThreads), 0, stream, items, count,
         iterations > 0, r, wb, s.at, s.slot);
}

#define MULTINORM_INSTANTIATE(T, G)                                                                                          \
  template void sinkgd_many<T, G>(const SinkgdManyItem*, int64_t, const SinkgdLayout&, int, float, const RuleScalars&, const WriteBack&, \
                                  ScalarsRef, cudaStream_t);
MULTINORM_INSTANTIATE(float, float)
MULTINORM_INSTANTIATE(bf16, bf16)
MULTINORM_INSTANTIATE(bf16, float)
#undef MULTINORM_INSTANTIATE

}  // namespace multinorm::cuda
