// Causal attention on tensor cores (mma.sync m16n8k16, BF16 in, FP32 accumulate): FlashAttention-2's
// algorithm, as the SIMT kernels of attention.cu, for BF16 storage and head sizes 64 and 128.
// Forward: a block of 4 warps takes 128 queries (32 per warp) and streams 64-key tiles of K and V
// through shared memory; S = Q K^T and O += P V are warp-level mma's, the online softmax runs on the
// accumulator fragments, and P goes from S's accumulators to the A operand of P V in registers
// (warp_matrix.cuh). Backward, deterministic, no atomics: one kernel per 128 keys at D = 64, 64 at
// D = 128 (dK, dV; streams query tiles from the diagonal on), one per as many queries (dQ; streams key
// tiles up to the diagonal); each recomputes P from the saved log-sum-exp.
//
// Streamed tiles arrive by cp.async under the mma's: the backward's are double-buffered (tile j + 1's
// copies issued right after the one barrier of step j, which both publishes tile j, each thread first
// waiting for its own copies, and ends every read of the buffer the next copies overwrite); the
// forward loads K and V into one buffer each in turns (see its kernel). Exponentials are 2^x with the
// softmax scale and log2 e folded into one FMA (fast_exp2); the causal mask is applied on the tiles
// that cross a warp's diagonal only; query blocks with the longest causal rows are launched first
// (the forward and dQ grids run backwards), so the short ones fill the tail of the wave.
//
// Layouts (the Backend seam): qkv[B*T, 3*H*D] rows [q heads | k heads | v heads], out[B*T, H*D],
// lse[B, H, T] (natural log), delta[B, H, T] = rowsum(dout * out) (attention.cu computes it).
// Shared tiles are row-major BF16 with rows of D + 8 elements: 16 bytes of padding put the 8 row
// addresses of an ldmatrix in 8 different bank quads (no conflicts).
//
// Cost per (b, h) with n = T(T+1)/2 causal pairs: forward 4 n D tensor-core FLOPs (S and P V),
// backward 10 n D (dK/dV kernel: S, dP, dV, dK = 8 n D; dQ kernel: S, dP, dQ = 6 n D; 14 n D in all,
// S and dP being computed twice), plus O(n) exponentials. Global traffic: Q, K, V (and dO) tiles,
// each streamed tile read once per later block: about T^2 D / R BF16 elements per (b, h) and kernel,
// R the block's rows (128; 64 in the backward at D = 128), every load a 16-byte one.
#include <cmath>

#include "device_utils.cuh"
#include "kernels.h"
#include "warp_matrix.cuh"

namespace multinorm::cuda {

namespace {

constexpr int kWarps = 4, kThreads = 32 * kWarps;  // a backward block

// Rows [row0, row0 + rows) of one head's section (`base` points at row 0's first element of it;
// rows `stride` elements apart) into a [rows][D + 8] shared tile by cp.async, 16 bytes at a time:
// on a GPU they may land any time from the issue to the issuing thread's cp_async_wait (the emulation
// lands them at the wait), so a copy is issued only after a barrier has ended every read of the
// bytes it overwrites. Rows past T are zero-filled without being read (the source then points at
// row 0, in bounds).
template <int D>
__device__ __forceinline__ void copy_rows_async(bf16* tile, const bf16* base, int64_t stride, int64_t row0, int rows, int64_t T_) {
  constexpr int kChunks = D / 8, kLd = D + 8;
  for (int k = threadIdx.x; k < rows * kChunks; k += blockDim.x) {
    const int r = k / kChunks, c = k % kChunks;
    const bool valid = row0 + r < T_;
    cp_async_16(tile + r * kLd + c * 8, base + (valid ? (row0 + r) * stride : 0) + c * 8, valid);
  }
}

// log2 e: the exponentials are 2^x with the softmax scale folded in (scale log2 e).
constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

// A fragments of a 16-row slab of a [rows][D + 8] tile (the warp's rows of Q, dO, K or V), one per
// 16-column step.
template <int D>
__device__ __forceinline__ void load_a_fragments(uint32_t (&f)[D / 16][4], const bf16* tile, int row0) {
  constexpr int kLd = D + 8;
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) ldmatrix_x4(f[ks], tile + (row0 + lane % 16) * kLd + ks * 16 + (lane / 16) * 8);
}

// Where mma_abt finds its A fragments, step ks for each of the warp's kM 16-row slabs: held in
// registers across the tiles (the dQ kernel's Q and dO, the forward's Q at D = 64), or read from a
// shared tile at every step (the dK/dV kernel's K and V, the forward's Q at D = 128: no registers
// left beside the accumulators to hold them).
template <int D, int kM>
struct FragmentsInRegisters {
  const uint32_t (&f)[kM][D / 16][4];
  __device__ __forceinline__ void operator()(int ks, uint32_t (&a)[kM][4]) const {
#pragma unroll
    for (int m = 0; m < kM; ++m)
#pragma unroll
      for (int i = 0; i < 4; ++i) a[m][i] = f[m][ks][i];
  }
};
template <int D, int kM>
struct FragmentsFromShared {
  const bf16* tile;  // [rows][D + 8]
  int row0;          // the first slab's first row
  __device__ __forceinline__ void operator()(int ks, uint32_t (&a)[kM][4]) const {
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int m = 0; m < kM; ++m) ldmatrix_x4(a[m], tile + (row0 + 16 * m + lane % 16) * (D + 8) + ks * 16 + (lane / 16) * 8);
  }
};

// acc[m][nt] = A_m x^T over D for the 8-row groups nt of a [rows][D + 8] tile x, with A_m the warp's
// kM 16-row slabs (fragments from load_a): the 16 x (8 NT) products S = Q K^T, dP = dO V^T,
// S^T = K Q^T. Each B fragment loaded serves all kM slabs; every acc[m][nt] sums its 16-column steps
// in ascending order whatever kM is. Groups are taken in pairs (one ldmatrix), so with live_tiles odd
// the pair's second group is formed too: its keys are masked by the caller like any other.
template <int D, int NT, int kM, class LoadA>
__device__ __forceinline__ void mma_abt(float (&acc)[kM][NT][4], const LoadA& load_a, const bf16* x, int live_tiles) {
  static_assert(NT % 2 == 0, "8-row groups in pairs");
  constexpr int kLd = D + 8;
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int m = 0; m < kM; ++m)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[m][nt][i] = 0.0f;
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    uint32_t a[kM][4];
    load_a(ks, a);
#pragma unroll
    for (int nt = 0; nt < NT; nt += 2) {
      if (nt >= live_tiles) continue;  // warp-uniform: every key of the pair is masked for every row
      uint32_t b[4];                   // B fragments of groups nt and nt + 1 at step ks
      ldmatrix_x4(b, x + (nt * 8 + (lane / 16) * 8 + lane % 8) * kLd + ks * 16 + (lane / 8) % 2 * 8);
#pragma unroll
      for (int m = 0; m < kM; ++m) {
        mma_bf16_16816(acc[m][nt], a[m], {b[0], b[1]});
        mma_bf16_16816(acc[m][nt + 1], a[m], {b[2], b[3]});
      }
    }
  }
}

// acc[m][nd] += P_m y over the K16 16-row steps of a [16 K16][D + 8] tile y, with P_m the warp's
// slab m of a 16 x 16 K16 matrix held as accumulator fragments p[m][nt] (columns 8 nt .. 8 nt + 7):
// O += P V, dV += P^T dO, dK += dS^T Q, dQ += dS K. Each B fragment serves all kM slabs.
template <int D, int NT, int kM>
__device__ __forceinline__ void mma_py(float (&acc)[kM][D / 8][4], const float (&p)[kM][NT][4], const bf16* y, int live_tiles) {
  constexpr int kLd = D + 8;
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int kk = 0; kk < NT / 2; ++kk) {
    if (2 * kk >= live_tiles) continue;
    uint32_t a[kM][4];
#pragma unroll
    for (int m = 0; m < kM; ++m) {
      a[m][0] = pack_bf16x2(p[m][2 * kk][0], p[m][2 * kk][1]);
      a[m][1] = pack_bf16x2(p[m][2 * kk][2], p[m][2 * kk][3]);
      a[m][2] = pack_bf16x2(p[m][2 * kk + 1][0], p[m][2 * kk + 1][1]);
      a[m][3] = pack_bf16x2(p[m][2 * kk + 1][2], p[m][2 * kk + 1][3]);
    }
#pragma unroll
    for (int nd = 0; nd < D / 8; nd += 2) {
      uint32_t b[4];  // B fragments of column groups nd and nd + 1
      ldmatrix_x4_trans(b, y + (kk * 16 + lane % 16) * kLd + nd * 8 + (lane / 16) * 8);
#pragma unroll
      for (int m = 0; m < kM; ++m) {
        mma_bf16_16816(acc[m][nd], a[m], {b[0], b[1]});
        mma_bf16_16816(acc[m][nd + 1], a[m], {b[2], b[3]});
      }
    }
  }
}

// Stores a warp's 16 x D accumulators (times `scale`) as BF16 rows row0 + g, row0 + g + 8 of `dst`
// (rows `stride` elements apart), rows past T skipped.
template <int D>
__device__ __forceinline__ void store_rows(bf16* dst, int64_t stride, int64_t row0, int64_t T_, const float (&acc)[D / 8][4], float scale0,
                                           float scale1) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t row = row0 + g + 8 * half;
    if (row >= T_) continue;
    const float s = half ? scale1 : scale0;
#pragma unroll
    for (int nd = 0; nd < D / 8; ++nd)
      *reinterpret_cast<uint32_t*>(dst + row * stride + nd * 8 + 2 * t) = pack_bf16x2(acc[nd][2 * half] * s, acc[nd][2 * half + 1] * s);
  }
}

// How many of a tile's 8-column groups (keys k0 + 8 nt ...) hold a key at or before `last_row`.
__device__ __forceinline__ int live_column_tiles(int64_t last_row, int64_t k0, int tiles) {
  const int64_t n = last_row < k0 ? 0 : (last_row - k0) / 8 + 1;
  return n < tiles ? static_cast<int>(n) : tiles;
}

// One key tile of the online softmax on the accumulator fragments of a warp's kM slabs: S (times
// scale2, the keys after each row masked) becomes P = 2^(S - m_new), each row's running max m and
// partial sum l move to this tile, and O is rescaled by 2^(m_old - m_new). `first_row`: the warp's
// first query less the tile's first key (its row i of the tile masks columns past first_row + i; kNt
// x 8 or more where the tile is wholly before every row). 32-bit offsets: 64-bit rows and keys cost
// the forward the registers it has none to spare of.
template <int kM, int kNt, int kNd>
__device__ __forceinline__ void online_softmax(float (&s)[kM][kNt][4], float (&o)[kM][kNd][4], float (&mrow)[kM][2], float (&l)[kM][2],
                                               int first_row, float scale2) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int m = 0; m < kM; ++m) {
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < kNt; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int column = nt * 8 + 2 * t + (i & 1), row = first_row + 16 * m + g + 8 * (i / 2);
        s[m][nt][i] = column > row ? -INFINITY : s[m][nt][i] * scale2;
        mx[i / 2] = fmaxf(mx[i / 2], s[m][nt][i]);
      }
    float alpha[2], m_use[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      for (int o_ = 1; o_ < 4; o_ <<= 1) mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], o_));  // the row's 4 lanes
      const float m_new = fmaxf(mrow[m][r], mx[r]);
      m_use[r] = m_new == -INFINITY ? 0.0f : m_new;  // a row with no key yet
      alpha[r] = fast_exp2(mrow[m][r] - m_use[r]);
      mrow[m][r] = m_new;
      l[m][r] *= alpha[r];
    }
#pragma unroll
    for (int nt = 0; nt < kNt; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        s[m][nt][i] = fast_exp2(s[m][nt][i] - m_use[i / 2]);
        l[m][i / 2] += s[m][nt][i];
      }
#pragma unroll
    for (int nd = 0; nd < kNd; ++nd)
#pragma unroll
      for (int i = 0; i < 4; ++i) o[m][nd][i] *= alpha[i / 2];
  }
}

// ---- forward ----------------------------------------------------------------------------------
// FlashAttention-2's forward shape for sm80 (its kernel traits; 8 warps of 16 rows measured 18-28%
// slower there at T = 2048): a block of 4 warps takes 128 queries, 32 a warp as two 16-row slabs, so
// each K and V fragment a warp loads from shared memory serves two mma's, and two blocks (8 warps)
// share an SM out of step, one's softmax under the other's products. Key tiles of 64 (FlashAttention-2
// takes 128 at D = 64; here that spills, ptxas CUDA 13.0). K and V have one buffer each, loaded in
// turns (FlashAttention-2's schedule): V_j lands while S_j = Q K_j^T and its softmax run, K_j+1 while
// O += P V_j runs; a barrier before each product publishes its tile and ends every read of the buffer
// the next copy overwrites. Q's fragments are read from shared memory once (D = 64) or at every
// 16-column step (D = 128, where holding them spills).
template <int D>
struct ForwardShape {
  static constexpr int kWarps = 4, kThreads = 32 * kWarps;
  static constexpr int kSlabs = 2;                    // 16-row slabs a warp
  static constexpr int kRows = 16 * kSlabs * kWarps;  // queries a block
  static constexpr int kKeys = 64;                    // keys a tile
  // Q's fragments held in registers (32 a lane at D = 64: 228 / 235 registers on sm_80 / sm_90, no
  // spill), or read from shared memory at each step (D = 128: held, they spill 764 bytes)
  static constexpr bool kQInRegisters = D == 64;
  // Q [kRows][D + 8], K and V [kKeys][D + 8]: 36.9 / 69.6 KB at D = 64 / 128 (two blocks an SM on an A100)
  static constexpr size_t smem() { return sizeof(bf16) * size_t(kRows + 2 * kKeys) * (D + 8); }
};

// grid (ceil(T / 128), B * H), 128 threads. scale2 = log2 e / sqrt(D): S is kept in the log2 domain
// (m too); lse is written in natural log.
template <int D>
__global__ void attention_forward_mma_kernel(bf16* out, float* lse, const bf16* qkv, int64_t T_, int H, float scale2) {
  using Shape = ForwardShape<D>;
  constexpr int kM = Shape::kSlabs, kKeys = Shape::kKeys, kNt = kKeys / 8, kLd = D + 8;
  MN_DYNAMIC_SHARED(bf16, smem);
  bf16* const qs = smem;
  bf16* const ks = qs + Shape::kRows * kLd;
  bf16* const vs = ks + kKeys * kLd;
  const int b = blockIdx.y / H, h = blockIdx.y % H;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t C = int64_t(H) * D, stride = 3 * C;
  const bf16* q_base = qkv + int64_t(b) * T_ * stride + h * D;
  const int64_t q0 = int64_t(gridDim.x - 1 - blockIdx.x) * Shape::kRows, w0 = q0 + 16 * kM * warp;  // the longest rows first
  const int64_t last_q = q0 + Shape::kRows - 1 < T_ - 1 ? q0 + Shape::kRows - 1 : T_ - 1;
  const int tiles = static_cast<int>(last_q / kKeys) + 1;
  uint32_t qf[kM][D / 16][4];  // Q's fragments where they stay in registers

  copy_rows_async<D>(qs, q_base, stride, q0, Shape::kRows, T_);
  copy_rows_async<D>(ks, q_base + C, stride, 0, kKeys, T_);
  cp_async_commit();
  float o[kM][D / 8][4];
#pragma unroll
  for (int m = 0; m < kM; ++m)
#pragma unroll
    for (int nd = 0; nd < D / 8; ++nd)
      for (int i = 0; i < 4; ++i) o[m][nd][i] = 0.0f;
  float mrow[kM][2], l[kM][2];  // per row, log2 domain; l is this lane's partial sum
#pragma unroll
  for (int m = 0; m < kM; ++m) mrow[m][0] = mrow[m][1] = -INFINITY, l[m][0] = l[m][1] = 0.0f;

  for (int j = 0; j < tiles; ++j) {
    const int64_t k0 = int64_t(j) * kKeys;
    cp_async_wait<0>();
    __syncthreads();  // K_j (and Q) in for every thread; every warp is done with V_j-1's buffer
    copy_rows_async<D>(vs, q_base + 2 * C, stride, k0, kKeys, T_);
    cp_async_commit();
    const int live = live_column_tiles(w0 + 16 * kM - 1, k0, kNt);  // 0: the whole tile is after this warp's queries
    float s[kM][kNt][4];
    if (live > 0) {
      if constexpr (Shape::kQInRegisters) {
        if (j == 0)
#pragma unroll
          for (int m = 0; m < kM; ++m) load_a_fragments<D>(qf[m], qs, 16 * kM * warp + 16 * m);
        mma_abt<D, kNt, kM>(s, FragmentsInRegisters<D, kM>{qf}, ks, live);
      } else {
        mma_abt<D, kNt, kM>(s, FragmentsFromShared<D, kM>{qs, 16 * kM * warp}, ks, live);
      }
      const bool diagonal = k0 + kKeys - 1 > w0;  // a key after the warp's first query (warp-uniform)
      online_softmax<kM, kNt>(s, o, mrow, l, diagonal ? static_cast<int>(w0 - k0) : kKeys, scale2);
    }
    cp_async_wait<0>();
    __syncthreads();  // V_j in for every thread; every warp is done with K_j's buffer
    if (j + 1 < tiles) {
      copy_rows_async<D>(ks, q_base + C, stride, k0 + kKeys, kKeys, T_);
      cp_async_commit();
    }
    if (live > 0) mma_py<D, kNt, kM>(o, s, vs, live);
  }
#pragma unroll
  for (int m = 0; m < kM; ++m) {
    float inv[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      for (int o_ = 1; o_ < 4; o_ <<= 1) l[m][r] += __shfl_xor_sync(0xffffffffu, l[m][r], o_);
      inv[r] = 1.0f / l[m][r];
      const int64_t row = w0 + 16 * m + g + 8 * r;
      if (t == 0 && row < T_) lse[(int64_t(b) * H + h) * T_ + row] = mrow[m][r] * kLn2 + logf(l[m][r]);
    }
    store_rows<D>(out + int64_t(b) * T_ * C + h * D, C, w0 + 16 * m, T_, o[m], inv[0], inv[1]);
  }
}

// ---- backward -----------------------------------------------------------------------------------
// Both kernels give a warp kM 16-row slabs (two at D = 64, so every streamed fragment serves two
// mma's; one at D = 128, whose dK and dV alone take 128 registers a slab) and 4 warps a block.

// dK, dV for 16 kM keys a warp (128 a block at D = 64, 64 at D = 128); grid (ceil(T / keys a block),
// B * H), 128 threads (the first key blocks, the longest, first). Streams query tiles of 32 rows from
// the block's first key on, double-buffered. Shared: K, V [keys][D + 8] (read at each 16-column step),
// two buffers of Q, dO [32][D + 8] and of lse (log2 domain), delta [32].
template <int D>
struct DkdvShape {
  static constexpr int kSlabs = D > 64 ? 1 : 2;
  static constexpr int kKeys = 16 * kSlabs * kWarps;  // keys a block
  static constexpr int kQ = 32;                       // queries a streamed tile
  static constexpr size_t smem() { return sizeof(bf16) * size_t(2 * kKeys + 4 * kQ) * (D + 8) + sizeof(float) * 4 * kQ; }
};

// Query tile q0 of the dK/dV kernel into buffer `buf`: Q and dO by cp.async (one commit), lse (times
// log2 e) and delta by plain stores (published by the same barrier).
template <int D, int kQ>
__device__ __forceinline__ void dkdv_query_tile(bf16* qs, bf16* dos, float* lse_s, float* delta_s, const bf16* base, const bf16* dout_base,
                                                const float* lse, const float* delta, int64_t stride, int64_t C, int64_t bh_T, int64_t q0,
                                                int64_t T_) {
  copy_rows_async<D>(qs, base, stride, q0, kQ, T_);
  copy_rows_async<D>(dos, dout_base, C, q0, kQ, T_);
  cp_async_commit();
  for (int k = threadIdx.x; k < kQ; k += kThreads) {
    lse_s[k] = q0 + k < T_ ? lse[bh_T + q0 + k] * kLog2e : 0.0f;
    delta_s[k] = q0 + k < T_ ? delta[bh_T + q0 + k] : 0.0f;
  }
}

template <int D>
__global__ void attention_backward_dkdv_mma_kernel(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse, const float* delta, int64_t T_,
                                                   int H, float scale, float scale2) {
  using Shape = DkdvShape<D>;
  constexpr int kM = Shape::kSlabs, kLd = D + 8, kQ = Shape::kQ, kNt = kQ / 8;
  MN_DYNAMIC_SHARED(bf16, smem);
  bf16* ks = smem;
  bf16* vs = ks + Shape::kKeys * kLd;
  // buffer i's Q, dO, lse, delta (selects, not arrays: a runtime index into an array of pointers spills it)
  bf16* const tiles_at = vs + Shape::kKeys * kLd;                             // Q0, Q1, dO0, dO1
  float* const floats_at = reinterpret_cast<float*>(tiles_at + 4 * kQ * kLd);  // lse0, lse1, delta0, delta1
  auto qbuf = [&](int i) { return tiles_at + i * kQ * kLd; };
  auto dobuf = [&](int i) { return tiles_at + (2 + i) * kQ * kLd; };
  auto lse_buf = [&](int i) { return floats_at + i * kQ; };
  auto delta_buf = [&](int i) { return floats_at + (2 + i) * kQ; };
  const int b = blockIdx.y / H, h = blockIdx.y % H;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t C = int64_t(H) * D, stride = 3 * C, bh_T = (int64_t(b) * H + h) * T_;
  const bf16* base = qkv + int64_t(b) * T_ * stride + h * D;
  const bf16* dout_base = dout + int64_t(b) * T_ * C + h * D;
  const int64_t k0 = int64_t(blockIdx.x) * Shape::kKeys, w0 = k0 + 16 * kM * warp;  // block's, warp's first key
  const int tiles = static_cast<int>((T_ - k0 + kQ - 1) / kQ);
  const FragmentsFromShared<D, kM> k_fragments{ks, 16 * kM * warp}, v_fragments{vs, 16 * kM * warp};

  copy_rows_async<D>(ks, base + C, stride, k0, Shape::kKeys, T_);
  copy_rows_async<D>(vs, base + 2 * C, stride, k0, Shape::kKeys, T_);
  dkdv_query_tile<D, kQ>(qbuf(0), dobuf(0), lse_buf(0), delta_buf(0), base, dout_base, lse, delta, stride, C, bh_T, k0, T_);
  float dk[kM][D / 8][4], dv[kM][D / 8][4];
#pragma unroll
  for (int m = 0; m < kM; ++m)
#pragma unroll
    for (int nd = 0; nd < D / 8; ++nd)
      for (int i = 0; i < 4; ++i) dk[m][nd][i] = dv[m][nd][i] = 0.0f;
  for (int j = 0; j < tiles; ++j) {
    cp_async_wait<0>();
    __syncthreads();  // tile j (and K, V) in for every thread; tile j - 1's buffer no longer read
    const int64_t q0 = k0 + int64_t(j) * kQ;
    if (j + 1 < tiles)
      dkdv_query_tile<D, kQ>(qbuf((j + 1) & 1), dobuf((j + 1) & 1), lse_buf((j + 1) & 1), delta_buf((j + 1) & 1), base, dout_base, lse, delta,
                             stride, C, bh_T, q0 + kQ, T_);
    if (q0 + kQ - 1 < w0) continue;  // every query of the tile is before this warp's keys
    const bf16* qs = qbuf(j & 1);
    const bf16* dos = dobuf(j & 1);
    const float* lse_s = lse_buf(j & 1);
    const float* delta_s = delta_buf(j & 1);
    float p[kM][kNt][4], dp[kM][kNt][4];
    mma_abt<D, kNt, kM>(p, k_fragments, qs, kNt);   // S^T = K Q^T: rows keys, columns queries
    mma_abt<D, kNt, kM>(dp, v_fragments, dos, kNt);  // dP^T = V dO^T
    // 32-bit offsets from the tile's first query: the warp's first key, the queries before T
    const int first_key = static_cast<int>(w0 - q0), queries = T_ - q0 < kQ ? static_cast<int>(T_ - q0) : kQ;
    const bool unmasked = first_key + 16 * kM - 1 <= 0 && queries == kQ;  // every query at or after every key of the warp
#pragma unroll
    for (int m = 0; m < kM; ++m)
#pragma unroll
      for (int nt = 0; nt < kNt; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int c = nt * 8 + 2 * t + (i & 1), key = first_key + 16 * m + g + 8 * (i / 2);
          const bool live = unmasked || (key <= c && c < queries);
          p[m][nt][i] = live ? fast_exp2(p[m][nt][i] * scale2 - lse_s[c]) : 0.0f;
          dp[m][nt][i] = p[m][nt][i] * (dp[m][nt][i] - delta_s[c]);  // dS^T
        }
    mma_py<D, kNt, kM>(dv, p, dos, kNt);  // dV += P^T dO
    mma_py<D, kNt, kM>(dk, dp, qs, kNt);  // dK += dS^T Q
  }
  bf16* dst = dqkv + int64_t(b) * T_ * stride + h * D;
#pragma unroll
  for (int m = 0; m < kM; ++m) {
    store_rows<D>(dst + C, stride, w0 + 16 * m, T_, dk[m], scale, scale);
    store_rows<D>(dst + 2 * C, stride, w0 + 16 * m, T_, dv[m], 1.0f, 1.0f);
  }
}

// dQ for 16 kM queries a warp (128 a block at D = 64, 64 at D = 128); grid (ceil(T / queries a block),
// B * H), 128 threads, the last query blocks (the longest) first. Streams key tiles of 32 rows up to
// the diagonal, double-buffered. Shared: Q, dO [queries][D + 8] (read once into fragments), two buffers
// of K, V [32][D + 8].
template <int D>
struct DqShape {
  static constexpr int kSlabs = D > 64 ? 1 : 2;
  static constexpr int kQueries = 16 * kSlabs * kWarps;  // queries a block
  static constexpr int kK = 32;                          // keys a streamed tile
  static constexpr size_t smem() { return sizeof(bf16) * size_t(2 * kQueries + 4 * kK) * (D + 8); }
};
template <int D>
__global__ void attention_backward_dq_mma_kernel(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse, const float* delta, int64_t T_,
                                                 int H, float scale, float scale2) {
  using Shape = DqShape<D>;
  constexpr int kM = Shape::kSlabs, kLd = D + 8, kK = Shape::kK, kNt = kK / 8;
  MN_DYNAMIC_SHARED(bf16, smem);
  bf16* qs = smem;
  bf16* dos = qs + Shape::kQueries * kLd;
  auto kbuf = [&](int i) { return dos + (Shape::kQueries + i * kK) * kLd; };  // K0, K1, V0, V1 after dO
  auto vbuf = [&](int i) { return dos + (Shape::kQueries + (2 + i) * kK) * kLd; };
  const int b = blockIdx.y / H, h = blockIdx.y % H;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t C = int64_t(H) * D, stride = 3 * C, bh_T = (int64_t(b) * H + h) * T_;
  const bf16* base = qkv + int64_t(b) * T_ * stride + h * D;
  const int64_t q0 = int64_t(gridDim.x - 1 - blockIdx.x) * Shape::kQueries, w0 = q0 + 16 * kM * warp;
  float row_lse[kM][2], row_delta[kM][2];
#pragma unroll
  for (int m = 0; m < kM; ++m)
    for (int r = 0; r < 2; ++r) {
      const int64_t row = w0 + 16 * m + g + 8 * r;
      row_lse[m][r] = row < T_ ? lse[bh_T + row] * kLog2e : 0.0f;
      row_delta[m][r] = row < T_ ? delta[bh_T + row] : 0.0f;
    }
  const int64_t last_q = q0 + Shape::kQueries - 1 < T_ - 1 ? q0 + Shape::kQueries - 1 : T_ - 1;
  const int tiles = static_cast<int>(last_q / kK) + 1;

  copy_rows_async<D>(qs, base, stride, q0, Shape::kQueries, T_);
  copy_rows_async<D>(dos, dout + int64_t(b) * T_ * C + h * D, C, q0, Shape::kQueries, T_);
  copy_rows_async<D>(kbuf(0), base + C, stride, 0, kK, T_);
  copy_rows_async<D>(vbuf(0), base + 2 * C, stride, 0, kK, T_);
  cp_async_commit();
  uint32_t qf[kM][D / 16][4], dof[kM][D / 16][4];
  float dq[kM][D / 8][4];
#pragma unroll
  for (int m = 0; m < kM; ++m)
#pragma unroll
    for (int nd = 0; nd < D / 8; ++nd)
      for (int i = 0; i < 4; ++i) dq[m][nd][i] = 0.0f;
  for (int j = 0; j < tiles; ++j) {
    cp_async_wait<0>();
    __syncthreads();  // tile j in for every thread; tile j - 1's buffer no longer read
    if (j + 1 < tiles) {
      copy_rows_async<D>(kbuf((j + 1) & 1), base + C, stride, int64_t(j + 1) * kK, kK, T_);
      copy_rows_async<D>(vbuf((j + 1) & 1), base + 2 * C, stride, int64_t(j + 1) * kK, kK, T_);
      cp_async_commit();
    }
    if (j == 0)
#pragma unroll
      for (int m = 0; m < kM; ++m) load_a_fragments<D>(qf[m], qs, 16 * kM * warp + 16 * m), load_a_fragments<D>(dof[m], dos, 16 * kM * warp + 16 * m);
    const int64_t k0 = int64_t(j) * kK;
    const int live = live_column_tiles(w0 + 16 * kM - 1, k0, kNt);
    if (live == 0) continue;
    const bf16* ks = kbuf(j & 1);
    float p[kM][kNt][4], ds[kM][kNt][4];
    mma_abt<D, kNt, kM>(p, FragmentsInRegisters<D, kM>{qf}, ks, live);            // S = Q K^T
    mma_abt<D, kNt, kM>(ds, FragmentsInRegisters<D, kM>{dof}, vbuf(j & 1), live);  // dP = dO V^T
    // the warp's first query less the tile's first key, 32-bit; kK where no key of the tile is after
    // any query of the warp (nothing masked)
    const int first_row = k0 + kK - 1 > w0 ? static_cast<int>(w0 - k0) : kK;
#pragma unroll
    for (int m = 0; m < kM; ++m)
#pragma unroll
      for (int nt = 0; nt < kNt; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int column = nt * 8 + 2 * t + (i & 1), row = first_row + 16 * m + g + 8 * (i / 2);
          p[m][nt][i] = column > row ? 0.0f : fast_exp2(p[m][nt][i] * scale2 - row_lse[m][i / 2]);
          ds[m][nt][i] = p[m][nt][i] * (ds[m][nt][i] - row_delta[m][i / 2]);
        }
    mma_py<D, kNt, kM>(dq, ds, ks, live);  // dQ += dS K
  }
#pragma unroll
  for (int m = 0; m < kM; ++m) store_rows<D>(dqkv + int64_t(b) * T_ * stride + h * D, stride, w0 + 16 * m, T_, dq[m], scale, scale);
}

}  // namespace

bool attention_mma_supported(int64_t D, std::initializer_list<const void*> pointers) {
  if (D != 64 && D != 128) return false;
  for (const void* p : pointers)
    if (reinterpret_cast<uintptr_t>(p) % 16) return false;  // the tiles load 16 bytes at a time
  return true;
}

void attention_forward_mma(bf16* out, float* lse, const bf16* qkv, int64_t B, int64_t T_, int64_t H, int64_t D, cudaStream_t stream) {
  const float scale2 = kLog2e / std::sqrt(static_cast<float>(D));
  const auto run = [&](auto kernel, auto shape) {
    using Shape = decltype(shape);
    launch("attention_forward_mma", kernel, dim3(ceil_div(T_, Shape::kRows), static_cast<unsigned>(B * H)), dim3(Shape::kThreads), Shape::smem(),
           stream, out, lse, qkv, T_, static_cast<int>(H), scale2);
  };
  if (D == 64)
    run(attention_forward_mma_kernel<64>, ForwardShape<64>{});
  else
    run(attention_forward_mma_kernel<128>, ForwardShape<128>{});
}

void attention_backward_mma(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse, const float* delta, int64_t B, int64_t T_, int64_t H,
                            int64_t D, cudaStream_t stream) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(D)), scale2 = scale * kLog2e;
  const auto run = [&](auto dkdv, auto dkdv_shape, auto dq, auto dq_shape) {
    using Dkdv = decltype(dkdv_shape);
    using Dq = decltype(dq_shape);
    const unsigned heads = static_cast<unsigned>(B * H);
    launch("attention_backward_dkdv_mma", dkdv, dim3(ceil_div(T_, Dkdv::kKeys), heads), dim3(kThreads), Dkdv::smem(), stream, dqkv, dout, qkv, lse,
           delta, T_, static_cast<int>(H), scale, scale2);
    launch("attention_backward_dq_mma", dq, dim3(ceil_div(T_, Dq::kQueries), heads), dim3(kThreads), Dq::smem(), stream, dqkv, dout, qkv, lse, delta,
           T_, static_cast<int>(H), scale, scale2);
  };
  if (D == 64)
    run(attention_backward_dkdv_mma_kernel<64>, DkdvShape<64>{}, attention_backward_dq_mma_kernel<64>, DqShape<64>{});
  else
    run(attention_backward_dkdv_mma_kernel<128>, DkdvShape<128>{}, attention_backward_dq_mma_kernel<128>, DqShape<128>{});
}

}  // namespace multinorm::cuda
