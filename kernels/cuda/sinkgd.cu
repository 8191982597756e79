// SinkGD on W, G [m, n] (the algorithm and its CPU twin: kernels/cpu/sinkgd.cpp), for many tensors
// at once: each pass is one launch over every tensor of the call (3 L + 1 launches in all).
//   X = diag(u) G diag(v) is never materialised. Each of the L iterations is three launches:
//   - row norms: a warp a row, lane l taking the row's 16-byte packs l, l + 32, ... (four loads in
//     flight), v staged once a block in shared memory; u_i = sqrt(n) / max(||G_i o v||, eps), a
//     lane's products summed in column order, then the warp's butterfly. The first pass takes v = 1.
//   - column partials: a thread a pack of columns over one row chunk's rows in order (four rows'
//     loads in flight), adding u_i^2 G_ij^2 (the chunks: cuda_scratch::sinkgd_chunks(m), the same
//     reduction tree on every GPU); each chunk's partial written to scratch.
//   - columns: v_j = sqrt(m) / max(sqrt(sum of the chunks' partials, in chunk order), eps).
//   The last launch reads G and W once and writes W.
// Why two reads of G an iteration: the fused pass that read it once (a row's norm, then its column
// sums from registers or shared memory) held 128 registers a thread and a barrier a row round, and
// ran at 23% of an H200's DRAM bandwidth (12.7 ms for llama_1b's matrices); these two passes are
// plain streaming reads with no barrier in their loops, as `sum_squares_many_partial` (90% of DRAM).
// Bytes: L x (2 |G| + 2 chunks n 4) + |G| + 2 |W|; with BF16 G and W, 4 L + 6 bytes per element (L = 5:
// 26 B/element), and no state. G moves 16 bytes a load where its rows start on 16 bytes (base and
// stride), a row's last pack masked where n is not whole packs (llama_1b's 5461-wide down projection
// in its 128-byte arena rows); dense rows off 16 bytes are read as the aligned packs that hold each
// row in the row norms, element by element in the column partials. The W write moves W and G in
// 16-byte packs where the rows start on 16 bytes (a row's last pack masked), else element by element.
// A block finds its tensor by a binary search of the launch's descriptors (at most kSinkgdManyPerLaunch, in L2).
#include <cmath>

#include "device_utils.cuh"
#include "kernels.h"
#include "multinorm/cuda_scratch.h"

namespace multinorm::cuda {

namespace {

constexpr int kThreads = cuda_scratch::kSinkgdThreads;

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

template <class G>
__device__ __forceinline__ Pack<G> zero_pack() {
  Pack<G> z;
#pragma unroll
  for (int p = 0; p < Pack<G>::kSize; ++p) z.v[p] = from_float<G>(0.0f);
  return z;
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

// Whether a tensor's rows all start on 16 bytes (its base and its row stride): the packed paths.
template <class G>
__device__ __forceinline__ bool rows_packed(const G* g, int64_t ld) {
  return aligned16(g) && (ld * int64_t(sizeof(G))) % 16 == 0;
}

// ||G_i o v||^2 of one row whose start is on 16 bytes, by a warp (each lane's part; the caller adds
// the lanes): lane l takes packs l, l + 32, ..., four loads in flight, its values in column order.
// vs: v in shared memory, whole packs of it (zero past n), read 16 bytes at a time.
template <class G>
__device__ __forceinline__ float row_norm_squared_packed(const G* gi, const float* vs, int64_t n) {
  constexpr int P = Pack<G>::kSize, kInFlight = 4;
  const int64_t packs = (n + P - 1) / P;
  float r = 0.0f;
  for (int64_t k0 = threadIdx.x % 32; k0 < packs; k0 += 32 * kInFlight) {
    Pack<G> x[kInFlight];
#pragma unroll
    for (int q = 0; q < kInFlight; ++q)
      x[q] = k0 + 32 * q < packs ? load_row_pack(gi, (k0 + 32 * q) * P, n) : zero_pack<G>();
#pragma unroll
    for (int q = 0; q < kInFlight; ++q) {
      const int64_t k = k0 + 32 * q;
      if (k >= packs) continue;
#pragma unroll
      for (int h = 0; h < P; h += 4) {
        const Pack<float> vv = *reinterpret_cast<const Pack<float>*>(vs + k * P + h);
#pragma unroll
        for (int p = 0; p < 4; ++p) {
          const float y = to_float(x[q].v[h + p]) * vv.v[p];
          r += y * y;
        }
      }
    }
  }
  return r;
}

// The same for row i of a tensor whose rows do not all start on 16 bytes (a dense row stride off 16
// bytes, or a base off 16 bytes): the row read as the aligned packs that hold it, the values outside
// it skipped (element by element only where a pack reaches past the tensor's (m - 1) ld + n elements).
template <class G>
__device__ float row_norm_squared_spanning(const G* g, int64_t i, int64_t m, int64_t n, int64_t ld, const float* vs) {
  constexpr int P = Pack<G>::kSize;
  const int64_t shift = int64_t(reinterpret_cast<uintptr_t>(g) % 16 / sizeof(G)), total = shift + (m - 1) * ld + n;
  const G* base = g - shift;  // elements counted from the aligned pack at or below g
  const int64_t row0 = shift + i * ld, first = row0 / P, last = (row0 + n - 1) / P;
  float r = 0.0f;
  for (int64_t k = first + threadIdx.x % 32; k <= last; k += 32) {
    const int64_t e0 = k * P;
    float x[P];
    if (e0 >= shift && e0 + P <= total) {
      load_values<G, P>(base, e0, x);
    } else {
#pragma unroll
      for (int p = 0; p < P; ++p) x[p] = e0 + p >= shift && e0 + p < total ? to_float(base[e0 + p]) : 0.0f;
    }
#pragma unroll
    for (int p = 0; p < P; ++p) {
      const int64_t j = e0 + p - row0;
      if (j < 0 || j >= n) continue;
      const float y = x[p] * vs[j];
      r += y * y;
    }
  }
  return r;
}

// The row norms of kSinkgdNormRows rows of one tensor (a block; a warp a row): u_i = sqrt(n) /
// max(||G_i o v||, eps). v is staged once into shared memory as whole packs (zero past n; ones before
// the first pass, where v is not read: x 1 is exact, so the same bits as skipping the product).
template <class G>
__global__ void MN_LAUNCH_BOUNDS(kThreads, 4) sinkgd_row_norms_kernel(const SinkgdManyItem* items, int64_t count, bool first_pass, float eps,
                                                                    const UpdateScalars* scalars) {
  if (scalars && scalars->stats.skip) return;  // a skipped update: no pass (the scratch is not read after)
  constexpr int P = Pack<G>::kSize;
  MN_DYNAMIC_SHARED(float, vs);
  const SinkgdManyItem& it = items[item_of_block(items, count, blockIdx.x, [](const SinkgdManyItem& x) { return x.first_norm_block; })];
  const G* g = static_cast<const G*>(it.g);
  const int64_t m = it.m, n = it.n, ld = it.ld, begin = (int64_t(blockIdx.x) - it.first_norm_block) * cuda_scratch::kSinkgdNormRows;
  const int64_t end = begin + cuda_scratch::kSinkgdNormRows < m ? begin + cuda_scratch::kSinkgdNormRows : m;
  float* u = it.scratch;
  const float* v = u + m;
  for (int64_t j = threadIdx.x; j < (n + P - 1) / P * P; j += blockDim.x) vs[j] = j >= n ? 0.0f : first_pass ? 1.0f : v[j];
  __syncthreads();
  const bool packed = rows_packed(g, ld);
  for (int64_t i = begin + threadIdx.x / 32; i < end; i += blockDim.x / 32) {  // warp-uniform
    const float r = warp_sum(packed ? row_norm_squared_packed(g + i * ld, vs, n) : row_norm_squared_spanning(g, i, m, n, ld, vs));
    if (threadIdx.x % 32 == 0) u[i] = it.sqrt_n / fmaxf(sqrtf(r), eps);
  }
}

// P values of a row from x + at, as stored (converted where used, so two rows in flight hold half
// the registers in BF16): 16-byte packs where the row starts on 16 bytes (loaded whole, past n too:
// a padded row's last pack is inside its stride), else those before column n one by one (0 after).
template <class X, int P>
__device__ __forceinline__ void load_row_values(const X* x, int64_t at, int64_t j, int64_t n, bool packed, X (&out)[P]) {
  constexpr int S = Pack<X>::kSize;
  if (packed) {
#pragma unroll
    for (int q = 0; q < P; q += S) {
      const Pack<X> pk = *reinterpret_cast<const Pack<X>*>(x + at + q);
#pragma unroll
      for (int p = 0; p < S; ++p) out[q + p] = pk.v[p];
    }
    return;
  }
#pragma unroll
  for (int p = 0; p < P; ++p) out[p] = j + p < n ? x[at + p] : from_float<X>(0.0f);
}

// A thread's share of a pass over a tensor's row chunks and column strips of n columns (the column
// partials and the W write; blocks: cuda_scratch::sinkgd_strip_blocks, the tensor's from
// first_block): block b's kThreads / S chunks and strip of S packs of P columns, a thread one pack:
// its chunk and its first column j (past the tensor's chunks or columns for some threads).
template <int P>
__device__ __forceinline__ void strip_share(int64_t n, int64_t first_block, int64_t& chunk, int64_t& j) {
  const int64_t packs = (n + P - 1) / P;
  const int S = cuda_scratch::sinkgd_strip_threads(n, P);
  const int64_t strips = (packs + S - 1) / S, local = int64_t(blockIdx.x) - first_block;
  chunk = local / strips * (kThreads / S) + threadIdx.x / S, j = (local % strips * S + threadIdx.x % S) * P;
}

// The column partials of one tensor's row chunks: block b takes kThreads / S chunks and a strip of S
// packs of columns (S: cuda_scratch::sinkgd_strip_threads), a thread one pack (P columns) over its
// chunk's rows in order, four rows' loads in flight, adding u_i^2 G_ij^2 (16-byte loads where the
// rows start on 16 bytes, a row's last pack masked; else element by element). Each chunk's sums go
// to its partial row in scratch; the columns pass adds them in chunk order. No barrier, no atomics.
template <class G>
__global__ void MN_LAUNCH_BOUNDS(kThreads, 4) sinkgd_col_partials_kernel(const SinkgdManyItem* items, int64_t count, const UpdateScalars* scalars) {
  if (scalars && scalars->stats.skip) return;
  constexpr int P = Pack<G>::kSize, kInFlight = 4;
  const SinkgdManyItem& it = items[item_of_block(items, count, blockIdx.x, [](const SinkgdManyItem& x) { return x.first_partial_block; })];
  const G* g = static_cast<const G*>(it.g);
  const int64_t m = it.m, n = it.n, ld = it.ld;
  int64_t chunk, j;
  strip_share<P>(n, it.first_partial_block, chunk, j);
  if (chunk >= it.chunks || j >= n) return;
  const float* u = it.scratch;
  float* partial = it.scratch + m + n + chunk * n;
  const int64_t begin = chunk * it.rows_per_chunk, end = begin + it.rows_per_chunk < m ? begin + it.rows_per_chunk : m;
  const bool packed = rows_packed(g, ld);
  float acc[P] = {};
  for (int64_t i0 = begin; i0 < end; i0 += kInFlight) {
    Pack<G> x[kInFlight];
#pragma unroll
    for (int q = 0; q < kInFlight; ++q) {
      const G* gi = g + (i0 + q) * ld;
      if (i0 + q >= end) {
        x[q] = zero_pack<G>();
      } else if (packed) {
        x[q] = load_row_pack(gi, j, n);
      } else {
#pragma unroll
        for (int p = 0; p < P; ++p) x[q].v[p] = j + p < n ? gi[j + p] : from_float<G>(0.0f);
      }
    }
#pragma unroll
    for (int q = 0; q < kInFlight; ++q) {
      if (i0 + q >= end) continue;
      const float ui = u[i0 + q], u2 = ui * ui;
#pragma unroll
      for (int p = 0; p < P; ++p) acc[p] += u2 * to_float(x[q].v[p]) * to_float(x[q].v[p]);
    }
  }
#pragma unroll
  for (int p = 0; p < P; ++p)
    if (j + p < n) partial[j + p] = acc[p];
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

// W <- W keep - lr u_i G_ij v_j over one tensor's row chunks and column strips, as the column
// partials take them (cuda_scratch::sinkgd_strip_blocks), u = v = 1 when there were no passes: a
// thread takes P columns (the wider of W's and G's 16-byte packs) over its chunk's rows, two rows'
// loads in flight, u_i a broadcast a row and its v from L1 (held in registers, they cost the third
// block an SM: 3 blocks of 256 at <= 80 registers; no division). Where both tensors' rows start on 16
// bytes, W and G move as 16-byte packs, a row's last pack read whole and written with its columns
// past n as they were (the padded arenas' down projection); else element by element. The rounding's
// index is the logical element's, i n + j, whatever ld.
template <class T, class G>
__global__ void MN_LAUNCH_BOUNDS(kThreads, 3) sinkgd_apply_kernel(const SinkgdManyItem* items, int64_t count, bool scaled, RuleScalars r, WriteBack wb,
                                                                  const UpdateScalars* s, int slot) {
  if (!take_update_scalars(s, slot, r, wb)) return;
  constexpr int P = Pack<T>::kSize > Pack<G>::kSize ? Pack<T>::kSize : Pack<G>::kSize, kInFlight = 2;
  const float lr = r.lr, keep = r.keep;
  const SinkgdManyItem& it = items[item_of_block(items, count, blockIdx.x, [](const SinkgdManyItem& x) { return x.first_apply_block; })];
  T* w = static_cast<T*>(it.w);
  const G* g = static_cast<const G*>(it.g);
  const int64_t m = it.m, n = it.n, ld = it.ld;
  int64_t chunk, j;
  strip_share<P>(n, it.first_apply_block, chunk, j);
  if (chunk >= it.chunks || j >= n) return;
  wb.tensor = it.tensor;
  const float* u = it.scratch;
  const float* v = u + m;
  const bool packed = packable<T>(w, ld) && packable<G>(g, ld) && ld % P == 0;
  const int64_t begin = chunk * it.rows_per_chunk, end = begin + it.rows_per_chunk < m ? begin + it.rows_per_chunk : m;
  for (int64_t i0 = begin; i0 < end; i0 += kInFlight) {
    T wk[kInFlight][P];
    G gk[kInFlight][P];
#pragma unroll
    for (int q = 0; q < kInFlight; ++q) {
      const int64_t at = (i0 + q < end ? i0 + q : i0) * ld + j;  // a row past the chunk reloads the first: never used
      load_row_values<T, P>(w, at, j, n, packed, wk[q]), load_row_values<G, P>(g, at, j, n, packed, gk[q]);
    }
#pragma unroll
    for (int q = 0; q < kInFlight; ++q) {
      const int64_t i = i0 + q, at = i * ld + j, k = i * n + j;
      if (i >= end) continue;
      const float ui = scaled ? u[i] : 1.0f;
      T out[P];
#pragma unroll
      for (int p = 0; p < P; ++p)  // past the row: the padding as it was
        out[p] = j + p >= n ? wk[q][p]
                            : store_weight<T>(to_float(wk[q][p]) * keep - lr * ui * to_float(gk[q][p]) * (scaled ? v[j + p] : 1.0f), wb,
                                              static_cast<uint64_t>(k + p));
      store_row_values<T, P>(w, at, n - j, packed, out);
    }
  }
}

}  // namespace

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

SinkgdLayout sinkgd_layout(SinkgdManyItem* items, int64_t count, int64_t w_bytes, int64_t g_bytes) {
  SinkgdLayout l;
  for (int64_t i = 0; i < count; ++i) {
    SinkgdManyItem& it = items[i];
    static_assert(kSharedOptInFloats % 8 == 0, "v is staged as whole packs: n up to the opt-in, rounded up, fits it");
    if (it.n > kSharedOptInFloats)
      throw_launch_error("sinkgd_row_norms", dim3(), dim3(), it.n * 4,
                         "a row of " + std::to_string(it.n) + " columns exceeds the " + std::to_string(kSharedOptInFloats) +
                             " values of v one block stages in shared memory (an A100's 163 KB)");
    it.first_norm_block = l.norm_blocks, it.first_partial_block = l.partial_blocks;
    it.first_col_block = l.col_blocks, it.first_apply_block = l.apply_blocks;
    if (it.m * it.n > 0) {
      l.norm_blocks += ceil_div(it.m, cuda_scratch::kSinkgdNormRows);
      l.partial_blocks += cuda_scratch::sinkgd_strip_blocks(it.m, it.n, 16 / g_bytes);
      l.apply_blocks += cuda_scratch::sinkgd_strip_blocks(it.m, it.n, 16 / std::min(w_bytes, g_bytes));  // the wider pack
    }
    l.col_blocks += ceil_div(it.n, kThreads);
    l.max_n = std::max(l.max_n, it.n);
  }
  return l;
}

template <class T, class G>
void sinkgd_many(const SinkgdManyItem* items, int64_t count, const SinkgdLayout& l, int iterations, float eps, const RuleScalars& r,
                 const WriteBack& wb, ScalarsRef s, cudaStream_t stream) {
  if (count == 0 || l.apply_blocks == 0) return;
  const size_t staged_v = static_cast<size_t>((l.max_n + 7) / 8 * 8) * sizeof(float);  // whole packs of the widest v
  for (int it = 0; it < iterations; ++it) {
    launch("sinkgd_row_norms", sinkgd_row_norms_kernel<G>, dim3(static_cast<unsigned>(l.norm_blocks)), dim3(kThreads), staged_v, stream, items, count,
           it == 0, eps, s.at);
    launch("sinkgd_col_partials", sinkgd_col_partials_kernel<G>, dim3(static_cast<unsigned>(l.partial_blocks)), dim3(kThreads), 0, stream, items,
           count, s.at);
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
