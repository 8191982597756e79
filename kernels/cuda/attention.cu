// Causal softmax attention, flash-style: tiles of Q, K, V in shared memory, an online softmax, the
// T x T score matrix never in global memory; the backward pass recomputes probabilities from the
// saved log-sum-exp (FlashAttention-2's scheme, made deterministic: dK/dV in one kernel parallel
// over key tiles, dQ in another parallel over query tiles; no atomics).
//
// Layouts (the Backend seam): qkv[B*T, 3*H*D] rows [q heads | k heads | v heads], out[B*T, H*D],
// lse[B, H, T]. Scale 1/sqrt(D). D <= kAttentionMaxHeadDim.
//
// Thread mapping: 128 threads per block; a tile row (a query in the forward and dQ kernels, a key
// in the dK/dV kernel) is owned by 8 consecutive lanes of one warp, lane `sub` owning the output
// columns d = sub + 8j. Row statistics reduce over those 8 lanes by width-8 shuffles.
//
// Cost per (b, h) with n = T(T+1)/2 causal (query, key) pairs: forward 4 n D FLOPs, backward 10 n D
// (dK/dV: recompute S, dP, then dV, dK; dQ: recompute S, dP, then dQ); global traffic O(T D) per
// tile row (each K/V tile is read by every query tile after it: T^2 D / (2 kTile) elements). These
// are SIMT FP32 FLOPs (19.5 TFLOP/s on an A100), not tensor-core ones: docs/cuda.md says what a
// tensor-core version would gain and why this one comes first.
#include <cmath>
#include <type_traits>

#include "device_utils.cuh"
#include "kernels.h"

namespace multinorm::cuda {

namespace {

constexpr int kThreads = 128;
constexpr int kRowsPerBlock = 16;  // query rows per forward / dQ block; key rows per dK/dV block
constexpr int kKeyTile = 32;       // keys per forward tile
constexpr int kBwdTile = 16;       // keys (dQ kernel) or queries (dK/dV kernel) per backward tile
constexpr int kMaxCols = kAttentionMaxHeadDim / 8;  // output columns per lane

// Loads rows [row0, row0 + rows) of one head's section of qkv-like storage into shared memory
// (stride `ld` floats), zero rows past T.
template <class T>
__device__ void load_tile(float* dst, int ld, const T* base, int64_t row_stride, int64_t row0, int rows, int64_t T_, int D) {
  for (int k = threadIdx.x; k < rows * D; k += blockDim.x) {
    const int r = k / D, d = k % D;
    dst[r * ld + d] = row0 + r < T_ ? to_float(base[(row0 + r) * row_stride + d]) : 0.0f;
  }
}

// ---- forward ------------------------------------------------------------------------------------
// grid (ceil(T / kRowsPerBlock), B * H); shared: q[16][D], k[32][D+1], v[32][D], p[16][32]
template <class T>
__global__ void attention_forward_kernel(T* out, float* lse, const T* qkv, int64_t T_, int H, int D, float scale) {
  MN_DYNAMIC_SHARED(float, smem);
  const int ldk = D + 1;
  float* qs = smem;
  float* ks = qs + kRowsPerBlock * D;
  float* vs = ks + kKeyTile * ldk;
  float* ps = vs + kKeyTile * D;
  const int b = blockIdx.y / H, h = blockIdx.y % H;
  const int64_t q0 = int64_t(blockIdx.x) * kRowsPerBlock;
  const int64_t C = int64_t(H) * D, row_stride = 3 * C;
  const T* q_base = qkv + int64_t(b) * T_ * row_stride + h * D;
  const int r = threadIdx.x / 8, sub = threadIdx.x % 8;
  const int64_t qpos = q0 + r;

  load_tile(qs, D, q_base, row_stride, q0, kRowsPerBlock, T_, D);
  float acc[kMaxCols];
#pragma unroll
  for (int j = 0; j < kMaxCols; ++j) acc[j] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  const int64_t last_q = q0 + kRowsPerBlock - 1 < T_ - 1 ? q0 + kRowsPerBlock - 1 : T_ - 1;
  const int64_t tiles = last_q / kKeyTile + 1;
  for (int64_t tile = 0; tile < tiles; ++tile) {
    const int64_t k0 = tile * kKeyTile;
    __syncthreads();  // the previous tile's k, v, p are no longer read
    load_tile(ks, ldk, q_base + C, row_stride, k0, kKeyTile, T_, D);
    load_tile(vs, D, q_base + 2 * C, row_stride, k0, kKeyTile, T_, D);
    __syncthreads();
    // scores of this lane's 4 keys
    float s[kKeyTile / 8];
    float tile_max = -INFINITY;
#pragma unroll
    for (int j = 0; j < kKeyTile / 8; ++j) {
      const int c = sub + 8 * j;
      const int64_t key = k0 + c;
      float dot = 0.0f;
      for (int d = 0; d < D; ++d) dot += qs[r * D + d] * ks[c * ldk + d];
      s[j] = (key <= qpos && qpos < T_) ? dot * scale : -INFINITY;
      tile_max = fmaxf(tile_max, s[j]);
    }
    for (int o = 4; o > 0; o >>= 1) tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, o, 8));
    const float m_new = fmaxf(m, tile_max);
    const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // a row with no key yet (or past T)
    const float alpha = __expf(m - m_use);
    float row_sum = 0.0f;
#pragma unroll
    for (int j = 0; j < kKeyTile / 8; ++j) {
      const float p = __expf(s[j] - m_use);
      ps[r * kKeyTile + sub + 8 * j] = p;
      row_sum += p;
    }
    for (int o = 4; o > 0; o >>= 1) row_sum += __shfl_xor_sync(0xffffffffu, row_sum, o, 8);
    l = l * alpha + row_sum;
    m = m_new;
    __syncwarp();  // the row's p values come from the 8 lanes of this warp
#pragma unroll
    for (int j = 0; j < kMaxCols; ++j) {
      const int d = sub + 8 * j;
      if (d < D) {
        float a = acc[j] * alpha;
        for (int c = 0; c < kKeyTile; ++c) a += ps[r * kKeyTile + c] * vs[c * D + d];
        acc[j] = a;
      }
    }
  }
  if (qpos < T_) {
    T* o = out + (int64_t(b) * T_ + qpos) * C + h * D;
    const float inv = 1.0f / l;
#pragma unroll
    for (int j = 0; j < kMaxCols; ++j) {
      const int d = sub + 8 * j;
      if (d < D) o[d] = from_float<T>(acc[j] * inv);
    }
    if (sub == 0) lse[(int64_t(b) * H + h) * T_ + qpos] = m + logf(l);
  }
}

// ---- backward -------------------------------------------------------------------------------------
// delta[b, h, t] = sum_d dout[t, h, d] * out[t, h, d], a (b, t, h) row to G lanes: G = D / 8 (a power
// of two up to 32) takes 8 values (16 bytes of BF16) a lane, 32 / G rows a warp; G = 32 a value a
// lane at a time. (A warp a row, a value a lane, ran at 2.6x its memory time on an H100, 2026-11-27.)
template <class T>
__global__ void attention_delta_kernel(float* delta, const T* dout, const T* out, int64_t rows, int64_t T_, int H, int D, int G) {
  const int lane = threadIdx.x % 32, sub = lane % G;
  const int64_t row = (int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32) * (32 / G) + lane / G;  // (b * T + t) * H + h
  float s = 0.0f;
  if (row < rows) {
    const T* dr = dout + row * D;
    const T* orow = out + row * D;
    if (8 * G == D) {
      float a[8], b[8];
      load_values<T, 8>(dr, 8 * sub, a);
      load_values<T, 8>(orow, 8 * sub, b);
#pragma unroll
      for (int k = 0; k < 8; ++k) s += a[k] * b[k];
    } else {
      for (int d = sub; d < D; d += G) s += to_float(dr[d]) * to_float(orow[d]);
    }
  }
  for (int o = G / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);  // every lane: no row leaves early
  if (row >= rows || sub != 0) return;
  const int64_t h = row % H, bt = row / H, b = bt / T_, t = bt % T_;
  delta[(b * H + h) * T_ + t] = s;
}

// Shared layout of both backward kernels: four [16][D+1] tiles (the block's own rows: a, b; the
// streamed tile: c, d) and two [16][17] score tiles, then 2 x 16 row statistics.
struct BwdSmem {
  float *own0, *own1, *tile0, *tile1, *p, *ds, *stat0, *stat1;
};
__device__ BwdSmem carve(float* smem, int D) {
  const int ld = D + 1, sq = kBwdTile * (kBwdTile + 1);
  BwdSmem s;
  s.own0 = smem;
  s.own1 = s.own0 + kRowsPerBlock * ld;
  s.tile0 = s.own1 + kRowsPerBlock * ld;
  s.tile1 = s.tile0 + kBwdTile * ld;
  s.p = s.tile1 + kBwdTile * ld;
  s.ds = s.p + sq;
  s.stat0 = s.ds + sq;
  s.stat1 = s.stat0 + kBwdTile;
  return s;
}
size_t bwd_smem_bytes(int D) {
  return sizeof(float) * (size_t(2 * kRowsPerBlock + 2 * kBwdTile) * (D + 1) + 2 * kBwdTile * (kBwdTile + 1) + 2 * kBwdTile);
}

// The (batch, head) a backward block works on (blockIdx.y = b * H + h), with its views of qkv, dout
// and the [B, H, T] statistics.
template <class T>
struct Head {
  int b, h;
  int64_t C, row_stride, bh_T;
  const T* qkv;   // row t of this head's q section; + C: k, + 2C: v
  const T* dout;  // row t of this head's output gradient
};
template <class T>
__device__ Head<T> head_of(const T* qkv, const T* dout, int64_t T_, int H, int D) {
  Head<T> hd;
  hd.b = blockIdx.y / H, hd.h = blockIdx.y % H;
  hd.C = int64_t(H) * D, hd.row_stride = 3 * hd.C, hd.bh_T = (int64_t(hd.b) * H + hd.h) * T_;
  hd.qkv = qkv + int64_t(hd.b) * T_ * hd.row_stride + hd.h * D;
  hd.dout = dout + int64_t(hd.b) * T_ * hd.C + hd.h * D;
  return hd;
}

// Statistics rows (lse, delta) of a query tile, zero past T.
__device__ void load_stats(float* lse_s, float* delta_s, const float* lse, const float* delta, int64_t bh_T, int64_t q0, int64_t T_) {
  for (int k = threadIdx.x; k < kBwdTile; k += blockDim.x) {
    lse_s[k] = q0 + k < T_ ? lse[bh_T + q0 + k] : 0.0f;
    delta_s[k] = q0 + k < T_ ? delta[bh_T + q0 + k] : 0.0f;
  }
}

// dK, dV for kRowsPerBlock keys; grid (ceil(T / 16), B * H). Streams query tiles from the block's
// first key on (causal: earlier queries do not see these keys).
template <class T>
__global__ void attention_backward_dkdv_kernel(T* dqkv, const T* dout, const T* qkv, const float* lse, const float* delta, int64_t T_, int H, int D,
                                               float scale) {
  MN_DYNAMIC_SHARED(float, smem);
  const BwdSmem s = carve(smem, D);
  const int ld = D + 1, lp = kBwdTile + 1;
  const Head<T> hd = head_of(qkv, dout, T_, H, D);
  const int64_t C = hd.C, row_stride = hd.row_stride, bh_T = hd.bh_T;
  const T *base = hd.qkv, *dout_base = hd.dout;
  const int64_t k0 = int64_t(blockIdx.x) * kRowsPerBlock;
  const int c = threadIdx.x / 8, sub = threadIdx.x % 8;  // this thread's key row and lane in its group
  const int64_t key = k0 + c;
  float* ks = s.own0;
  float* vs = s.own1;
  float* qs = s.tile0;
  float* dos = s.tile1;
  load_tile(ks, ld, base + C, row_stride, k0, kRowsPerBlock, T_, D);
  load_tile(vs, ld, base + 2 * C, row_stride, k0, kRowsPerBlock, T_, D);
  float dk[kMaxCols], dv[kMaxCols];
#pragma unroll
  for (int j = 0; j < kMaxCols; ++j) dk[j] = dv[j] = 0.0f;
  for (int64_t q0 = k0 / kBwdTile * kBwdTile; q0 < T_; q0 += kBwdTile) {
    __syncthreads();  // previous tile consumed (and, the first time, the k/v loads visible below)
    load_tile(qs, ld, base, row_stride, q0, kBwdTile, T_, D);
    load_tile(dos, ld, dout_base, C, q0, kBwdTile, T_, D);
    load_stats(s.stat0, s.stat1, lse, delta, bh_T, q0, T_);
    __syncthreads();
    // p[q][c] and ds[q][c] for this key and the lane's 2 queries
#pragma unroll
    for (int j = 0; j < kBwdTile / 8; ++j) {
      const int qr = sub + 8 * j;
      const int64_t q = q0 + qr;
      float qk = 0.0f, dp = 0.0f;
      for (int d = 0; d < D; ++d) {
        qk += qs[qr * ld + d] * ks[c * ld + d];
        dp += dos[qr * ld + d] * vs[c * ld + d];
      }
      const bool live = key <= q && q < T_ && key < T_;
      const float p = live ? __expf(qk * scale - s.stat0[qr]) : 0.0f;
      s.p[qr * lp + c] = p;
      s.ds[qr * lp + c] = p * (dp - s.stat1[qr]);
    }
    __syncwarp();  // this key's column of p and ds comes from the 8 lanes of this warp
#pragma unroll
    for (int j = 0; j < kMaxCols; ++j) {
      const int d = sub + 8 * j;
      if (d < D) {
        float a = dv[j], g = dk[j];
        for (int qr = 0; qr < kBwdTile; ++qr) {
          a += s.p[qr * lp + c] * dos[qr * ld + d];
          g += s.ds[qr * lp + c] * qs[qr * ld + d];
        }
        dv[j] = a, dk[j] = g;
      }
    }
  }
  if (key < T_) {
    T* row = dqkv + (int64_t(hd.b) * T_ + key) * row_stride + hd.h * D;
#pragma unroll
    for (int j = 0; j < kMaxCols; ++j) {
      const int d = sub + 8 * j;
      if (d < D) {
        row[C + d] = from_float<T>(dk[j] * scale);
        row[2 * C + d] = from_float<T>(dv[j]);
      }
    }
  }
}

// dQ for kRowsPerBlock queries; grid (ceil(T / 16), B * H). Streams key tiles up to the diagonal.
template <class T>
__global__ void attention_backward_dq_kernel(T* dqkv, const T* dout, const T* qkv, const float* lse, const float* delta, int64_t T_, int H, int D,
                                             float scale) {
  MN_DYNAMIC_SHARED(float, smem);
  const BwdSmem s = carve(smem, D);
  const int ld = D + 1, lp = kBwdTile + 1;
  const Head<T> hd = head_of(qkv, dout, T_, H, D);
  const int64_t C = hd.C, row_stride = hd.row_stride, bh_T = hd.bh_T;
  const T *base = hd.qkv, *dout_base = hd.dout;
  const int64_t q0 = int64_t(blockIdx.x) * kRowsPerBlock;
  const int r = threadIdx.x / 8, sub = threadIdx.x % 8;
  const int64_t q = q0 + r;
  float* qs = s.own0;
  float* dos = s.own1;
  float* ks = s.tile0;
  float* vs = s.tile1;
  load_tile(qs, ld, base, row_stride, q0, kRowsPerBlock, T_, D);
  load_tile(dos, ld, dout_base, C, q0, kRowsPerBlock, T_, D);
  load_stats(s.stat0, s.stat1, lse, delta, bh_T, q0, T_);
  float dq[kMaxCols];
#pragma unroll
  for (int j = 0; j < kMaxCols; ++j) dq[j] = 0.0f;
  const int64_t last_q = q0 + kRowsPerBlock - 1 < T_ - 1 ? q0 + kRowsPerBlock - 1 : T_ - 1;
  for (int64_t k0 = 0; k0 <= last_q; k0 += kBwdTile) {
    __syncthreads();
    load_tile(ks, ld, base + C, row_stride, k0, kBwdTile, T_, D);
    load_tile(vs, ld, base + 2 * C, row_stride, k0, kBwdTile, T_, D);
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kBwdTile / 8; ++j) {
      const int c = sub + 8 * j;
      const int64_t key = k0 + c;
      float qk = 0.0f, dp = 0.0f;
      for (int d = 0; d < D; ++d) {
        qk += qs[r * ld + d] * ks[c * ld + d];
        dp += dos[r * ld + d] * vs[c * ld + d];
      }
      const bool live = key <= q && q < T_;
      const float p = live ? __expf(qk * scale - s.stat0[r]) : 0.0f;
      s.ds[r * lp + c] = p * (dp - s.stat1[r]);
    }
    __syncwarp();  // the row's ds values come from the 8 lanes of this warp
#pragma unroll
    for (int j = 0; j < kMaxCols; ++j) {
      const int d = sub + 8 * j;
      if (d < D) {
        float a = dq[j];
        for (int c = 0; c < kBwdTile; ++c) a += s.ds[r * lp + c] * ks[c * ld + d];
        dq[j] = a;
      }
    }
  }
  if (q < T_) {
    T* row = dqkv + (int64_t(hd.b) * T_ + q) * row_stride + hd.h * D;
#pragma unroll
    for (int j = 0; j < kMaxCols; ++j) {
      const int d = sub + 8 * j;
      if (d < D) row[d] = from_float<T>(dq[j] * scale);
    }
  }
}

// ---- decoding (batch 1) -------------------------------------------------------------------------------
// One block of kDecodeWarps warps per head: append this position's k and v to the caches, then
// softmax(q K^T) V over positions 0..pos with an online softmax, so any context length fits: warp w
// takes positions w, w + warps, ..., keeping its running max, sum and output row (lane l owns
// dimensions l, l + 32, ...); the warps' partial rows are then merged in warp order (deterministic).
// bytes: 2 (pos + 1) D sizeof(T) (K and V read once) + 5 D sizeof(T); ~4 (pos + 1) D FLOPs.
constexpr int kDecodeWarps = 4;
constexpr int kDecodeLaneDims = kAttentionMaxHeadDim / 32;  // dimensions a lane owns at most

template <class T>
__global__ void attention_decode_kernel(T* out, const T* qkv, T* k_cache, T* v_cache, int64_t pos, int H, int D, float scale) {
  __shared__ float part_m[kDecodeWarps], part_l[kDecodeWarps], part_o[kDecodeWarps][kAttentionMaxHeadDim];
  const int h = blockIdx.x, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t C = int64_t(H) * D;
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    k_cache[pos * C + h * D + d] = qkv[C + h * D + d];
    v_cache[pos * C + h * D + d] = qkv[2 * C + h * D + d];
  }
  __syncthreads();  // the new cache row is visible to every thread of the block
  float q[kDecodeLaneDims], o[kDecodeLaneDims];
#pragma unroll
  for (int i = 0; i < kDecodeLaneDims; ++i) {
    const int d = lane + 32 * i;
    q[i] = d < D ? to_float(qkv[h * D + d]) * scale : 0.0f;
    o[i] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  for (int64_t j = warp; j <= pos; j += kDecodeWarps) {
    const T* kj = k_cache + j * C + h * D;
    const T* vj = v_cache + j * C + h * D;
    float dot = 0.0f;
#pragma unroll
    for (int i = 0; i < kDecodeLaneDims; ++i)
      if (lane + 32 * i < D) dot += q[i] * to_float(kj[lane + 32 * i]);
    const float s = warp_sum(dot), m_new = fmaxf(m, s);
    const float correction = __expf(m - m_new), p = __expf(s - m_new);
    l = l * correction + p;
#pragma unroll
    for (int i = 0; i < kDecodeLaneDims; ++i)
      if (lane + 32 * i < D) o[i] = o[i] * correction + p * to_float(vj[lane + 32 * i]);
    m = m_new;
  }
  if (lane == 0) part_m[warp] = m, part_l[warp] = l;
#pragma unroll
  for (int i = 0; i < kDecodeLaneDims; ++i)
    if (lane + 32 * i < D) part_o[warp][lane + 32 * i] = o[i];
  __syncthreads();
  float top = -INFINITY;
  for (int w = 0; w < kDecodeWarps; ++w) top = fmaxf(top, part_m[w]);
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float sum = 0.0f, a = 0.0f;
    for (int w = 0; w < kDecodeWarps; ++w) {  // a warp with no position has l = 0 and weight exp(-inf) = 0
      const float weight = __expf(part_m[w] - top);
      sum += part_l[w] * weight;
      a += part_o[w][d] * weight;
    }
    out[h * D + d] = from_float<T>(a / sum);
  }
}

void check_head_dim(int64_t D, const char* op) {
  if (D > kAttentionMaxHeadDim || D < 1)
    throw_launch_error(op, dim3(), dim3(), 0, "head dimension " + std::to_string(D) + " is not supported (at most " +
                                                  std::to_string(kAttentionMaxHeadDim) + ")");
}

}  // namespace

template <class T>
void attention_forward(T* out, float* lse, const T* qkv, int64_t B, int64_t T_, int64_t H, int64_t D, cudaStream_t stream) {
  check_head_dim(D, "attention_forward");
  if (B * T_ * H == 0) return;
  if constexpr (std::is_same_v<T, bf16>) {
    if (attention_mma_supported(D, {out, qkv})) return attention_forward_mma(out, lse, qkv, B, T_, H, D, stream);
  }
  const size_t smem = sizeof(float) * (kRowsPerBlock * D + kKeyTile * (D + 1) + kKeyTile * D + kRowsPerBlock * kKeyTile);
  launch("attention_forward", attention_forward_kernel<T>, dim3(ceil_div(T_, kRowsPerBlock), static_cast<unsigned>(B * H)), dim3(kThreads), smem,
         stream, out, lse, qkv, T_, static_cast<int>(H), static_cast<int>(D), 1.0f / std::sqrt(static_cast<float>(D)));
}

template <class T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse, int64_t B, int64_t T_, int64_t H, int64_t D,
                        float* scratch, cudaStream_t stream) {
  check_head_dim(D, "attention_backward");
  if (B * T_ * H == 0) return;
  const int64_t rows = B * T_ * H;
  const int64_t packs = D / 8;  // lanes a row when each takes 16 bytes
  const bool packed = D % 8 == 0 && packs <= 32 && (packs & (packs - 1)) == 0 && aligned16(dout) && aligned16(out);
  const int G = packed ? static_cast<int>(packs) : 32;
  launch("attention_delta", attention_delta_kernel<T>, dim3(ceil_div(rows, 4 * (32 / G))), dim3(128), 0, stream, scratch, dout, out, rows, T_,
         static_cast<int>(H), static_cast<int>(D), G);
  if constexpr (std::is_same_v<T, bf16>) {
    if (attention_mma_supported(D, {dqkv, dout, qkv})) return attention_backward_mma(dqkv, dout, qkv, lse, scratch, B, T_, H, D, stream);
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const dim3 grid(ceil_div(T_, kRowsPerBlock), static_cast<unsigned>(B * H));
  launch("attention_backward_dkdv", attention_backward_dkdv_kernel<T>, grid, dim3(kThreads), bwd_smem_bytes(static_cast<int>(D)), stream, dqkv,
         dout, qkv, lse, scratch, T_, static_cast<int>(H), static_cast<int>(D), scale);
  launch("attention_backward_dq", attention_backward_dq_kernel<T>, grid, dim3(kThreads), bwd_smem_bytes(static_cast<int>(D)), stream, dqkv, dout,
         qkv, lse, scratch, T_, static_cast<int>(H), static_cast<int>(D), scale);
}

template <class T>
void attention_decode(T* out, const T* qkv, T* k_cache, T* v_cache, int64_t pos, int64_t H, int64_t D, cudaStream_t stream) {
  check_head_dim(D, "attention_decode");
  launch("attention_decode", attention_decode_kernel<T>, dim3(static_cast<unsigned>(H)), dim3(32 * kDecodeWarps), 0, stream, out, qkv, k_cache,
         v_cache, pos,
         static_cast<int>(H), static_cast<int>(D), 1.0f / std::sqrt(static_cast<float>(D)));
}

template void attention_forward<float>(float*, float*, const float*, int64_t, int64_t, int64_t, int64_t, cudaStream_t);
template void attention_forward<bf16>(bf16*, float*, const bf16*, int64_t, int64_t, int64_t, int64_t, cudaStream_t);
template void attention_backward<float>(float*, const float*, const float*, const float*, const float*, int64_t, int64_t, int64_t, int64_t, float*,
                                        cudaStream_t);
template void attention_backward<bf16>(bf16*, const bf16*, const bf16*, const bf16*, const float*, int64_t, int64_t, int64_t, int64_t, float*,
                                       cudaStream_t);
template void attention_decode<float>(float*, const float*, float*, float*, int64_t, int64_t, int64_t, cudaStream_t);
template void attention_decode<bf16>(bf16*, const bf16*, bf16*, bf16*, int64_t, int64_t, int64_t, cudaStream_t);

}  // namespace multinorm::cuda
