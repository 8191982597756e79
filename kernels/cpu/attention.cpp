// Causal multi-head attention on qkv[B*T, 3*H*D] (row layout [q heads | k heads | v heads], q and k
// already rotated), in 32 x 32 blocks that stop at the diagonal ("flash-style": no T x T buffer, the
// masked half is never computed). Scale s = 1/sqrt(D); e = the end of query tile i (keys 0..e-1).
//   Forward, per head and 32-query tile i:
//     S = q_i k[0:e]^T                     [32, e]   block products, key blocks up to the diagonal
//     P = exp(s S - s m) / l (j <= query)  [32, e]   m = row max, l = row sum (FP32), then rounded
//     o_i = P v[0:e]                       [32, D]
//     lse_i = s m + log l                  [32]      saved: the backward recomputes P from it
//   Backward, from lse (o is only read for delta = rowsum(do * o)):
//     key pass, per 32-key tile j (queries j..T-1):
//       S^T = k_j q^T, dP^T = v_j do^T     [32, T-j]
//       P^T = exp(s S^T - lse), dS^T = P^T (dP^T - delta) s
//       dv_j = P^T do,  dk_j = dS^T q      [32, D]
//       dq^T[:, j:] += k_j^T dS^T          [D, T-j]  FP32, the tile's 32 keys as K
//     then dq = (dq^T)^T.
//   A head is owned by one thread, which adds the key tiles' dq^T in ascending order: every output
//   row is summed by one thread in a fixed order (no atomics, deterministic), and S and dP are formed
//   once (5 products). With fewer than two heads per thread a head's tiles are split over threads
//   (attention_splits_per_head); dq is then summed by a query pass instead, per query tile i (keys
//   0..e-1): S = q_i k^T, dP = do_i v^T, P, dS as above; dq_i = dS k (7 products). Both sum the same
//   products over keys in the same order: the same bits (the thread-count test checks it).
//
// Softmax: each query tile holds its whole key strip (32 x e FP32, 128 KB at T = 1024: L2), so the
// softmax is exact in two passes over the strip instead of online. The online form exists for GPUs,
// whose shared memory cannot hold the strip; here it would only add a rescale of the output
// accumulator (a store and reload of the tiles) per key block. Memory is linear in T either way.
//
// FLOPs per head (causal, T = 32 n): forward 2 x 2 D (32^2) n(n+1)/2 ~ 2 D T^2 (1/2 + 1/(2n)) x 2,
// i.e. the full-matrix 4 D T^2 times (n+1)/(2n); backward 5 such products (7 with split heads)
// instead of 5 full ones.
//
// Block products run on one of three engines (AttentionEngine) with the same operand plan:
//   AMX:         BF16 operands in the tiles' layouts (amx_tiles.h), FP32 accumulation; T = bf16 only.
//   AVX512_BF16: the same BF16 operands, VDPBF16PS register blocks (dpbf16_block.h); T = bf16 only.
//   Portable:    FP32 operands, 4 x 32 register blocks the compiler vectorises; any T. P and dS are
//                rounded to T before their products, as the BF16 engines (and PyTorch's bf16
//                attention) do.
// Parallel over heads: a thread packs one head's operands into its own scratch (L2) and runs all of
// that head's tiles (see splits_per_head for fewer heads than threads). Operands of a head, padded
// with zeros to Tp x Dp (Tp, Dp multiples of 32):
//   rows(x)        x as [Tp][Dp] rows                        A operand
//   transposed(x)  B operand "x^T" (K = Dp, N = Tp)          BF16: packed panels; portable: [Dp][Tp]
//   normal(x)      B operand "x"   (K = Tp, N = Dp)          BF16: packed panels; portable: [Tp][Dp]
//   k^T as rows    [Dp][Tp], the A operand of dq^T; a key tile's dS^T strip is packed as normal(x)
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <type_traits>

#include "../common/fast_math.h"
#include "amx_tiles.h"
#include "bf16_rows.h"
#include "cpu_kernels.h"
#include "dpbf16_block.h"
#include "exp_rows.h"
#include "matmul_packed.h"

namespace multinorm::cpu {

namespace {

constexpr int64_t kTile = 32;

// BF16 operands in the tiles' layouts (amx_tiles.h): rows for A, packed panels for B. Shared by
// the two engines that multiply them, which differ only in their block product.
struct PackedBf16Operands {
  using E = uint16_t;  // BF16 bits
  template <class T>
  static E in(T x) {
    static_assert(std::is_same_v<T, bf16>, "the BF16 engines take BF16 operands");
    return x.bits;
  }
  template <class T>
  static E strip(float x) {  // P and dS: BF16 (the block product's input)
    return to_bf16(x).bits;
  }
  template <class T>
  static void strip_row(const float* x, E* dst, int64_t n) {  // strip of each: 32 per instruction
    round_row_to_bf16(x, reinterpret_cast<bf16*>(dst), n);
  }
  static float value(E x) { return to_f32(bf16{x}); }
  static void pack_transposed(E* dst, const E* rows, int64_t Tp, int64_t Dp) {
    for (int64_t nb = 0; nb < Tp / 16; ++nb) amx::pack_b_panel(dst + nb * Dp * 16, rows, Dp, nb, Tp, Dp, Dp, true);
  }
  static void pack_normal(E* dst, const E* rows, int64_t Tp, int64_t Dp) {
    for (int64_t nb = 0; nb < Dp / 16; ++nb) amx::pack_b_panel(dst + nb * Tp * 16, rows, Dp, nb, Dp, Tp, Tp, false);
  }
  static void transpose_rows(E* dst, const E* rows, int64_t Tp, int64_t Dp) {  // [Tp][Dp] -> [Dp][Tp]
    for (int64_t t0 = 0; t0 < Tp; t0 += kTile)
      for (int64_t d0 = 0; d0 < Dp; d0 += 16) amx::transpose_block_32x16(dst + d0 * Tp + t0, Tp, rows + t0 * Dp + d0, Dp);
  }
  // Element (k0, n0) of a packed B whose K extent is bK: the first of the block's two panels.
  static const E* panels_at(const E* b, int64_t bK, int64_t k0, int64_t n0) { return b + (n0 / 16) * bK * 16 + (k0 / 2) * 32; }
};

struct AmxEngine : PackedBf16Operands {
  static void begin() { amx::configure_tiles(); }
  static void end() { amx::release_tiles(); }
  // c[32 x 32] (+)= a[32 x K] b[k0:k0+K, n0:n0+32] of a packed B whose full extent is bK x bN.
  static void block(float* c, int64_t ldc, const E* a, int64_t lda, const E* b, int64_t bK, int64_t /*bN*/, int64_t k0,
                    int64_t n0, int64_t K, bool accumulate = false) {
    amx::block_32x32(c, ldc, accumulate, a, lda, panels_at(b, bK, k0, n0), bK * 16, K);
  }
};

struct Avx512Bf16Engine : PackedBf16Operands {
  static void begin() {}
  static void end() {}
  // As AmxEngine::block, on VDPBF16PS (dpbf16_block.h).
  static void block(float* c, int64_t ldc, const E* a, int64_t lda, const E* b, int64_t bK, int64_t /*bN*/, int64_t k0,
                    int64_t n0, int64_t K, bool accumulate = false) {
    dpbf16::block_32x32(c, ldc, accumulate, a, lda, panels_at(b, bK, k0, n0), bK * 16, K);
  }
};

struct PortableEngine {
  using E = float;
  template <class T>
  static E in(T x) {
    return to_f32(x);
  }
  template <class T>
  static E strip(float x) {  // rounded to the storage type, as the AMX path rounds to BF16
    return to_f32(from_f32<T>(x));
  }
  template <class T>
  static void strip_row(const float* x, E* dst, int64_t n) {
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) dst[j] = strip<T>(x[j]);
  }
  static float value(E x) { return x; }
  static void begin() {}
  static void end() {}
  static void pack_transposed(E* dst, const E* rows, int64_t Tp, int64_t Dp) {  // [Dp][Tp]
    for (int64_t t0 = 0; t0 < Tp; t0 += kTile)
      for (int64_t d = 0; d < Dp; ++d)
        for (int64_t t = t0; t < t0 + kTile; ++t) dst[d * Tp + t] = rows[t * Dp + d];
  }
  static void pack_normal(E* dst, const E* rows, int64_t Tp, int64_t Dp) {
    std::memcpy(dst, rows, Tp * Dp * sizeof(E));
  }
  static void transpose_rows(E* dst, const E* rows, int64_t Tp, int64_t Dp) {  // [Tp][Dp] -> [Dp][Tp]
    for (int64_t t = 0; t < Tp; ++t)
      for (int64_t d = 0; d < Dp; ++d) dst[d * Tp + t] = rows[t * Dp + d];
  }
  // c[32 x 32] (+)= a[32 x K] b[k0:k0+K, n0:n0+32], b row-major bK x bN. Four rows of c stay in
  // registers (8 vectors) while K streams: 2 loads of b and 4 broadcasts per 8 FMAs.
  static void block(float* c, int64_t ldc, const E* a, int64_t lda, const E* b, int64_t /*bK*/, int64_t bN, int64_t k0,
                    int64_t n0, int64_t K, bool accumulate = false) {
    const float* bp = b + k0 * bN + n0;
    for (int64_t r0 = 0; r0 < kTile; r0 += 4) {
      float acc[4][kTile] = {};
      if (accumulate)
        for (int64_t r = 0; r < 4; ++r) std::memcpy(acc[r], c + (r0 + r) * ldc, sizeof(acc[r]));
      const float* a0 = a + r0 * lda;
      for (int64_t k = 0; k < K; ++k) {
        const float* brow = bp + k * bN;
        const float x0 = a0[k], x1 = a0[lda + k], x2 = a0[2 * lda + k], x3 = a0[3 * lda + k];
#pragma omp simd
        for (int64_t j = 0; j < kTile; ++j) {
          acc[0][j] += x0 * brow[j];
          acc[1][j] += x1 * brow[j];
          acc[2][j] += x2 * brow[j];
          acc[3][j] += x3 * brow[j];
        }
      }
      for (int64_t r = 0; r < 4; ++r) std::memcpy(c + (r0 + r) * ldc, acc[r], sizeof(acc[r]));
    }
  }
};

// rows[t][:] <- x[(b*T + t) * stride + col + h*D + :] for t < T, zeros to Tp x Dp.
template <class Eng, class T>
void gather_head(typename Eng::E* rows, const T* x, int64_t b, int64_t h, int64_t T_, int64_t D, int64_t Tp, int64_t Dp,
                 int64_t stride, int64_t col) {
  using E = typename Eng::E;
  for (int64_t t = 0; t < Tp; ++t) {
    E* r = rows + t * Dp;
    int64_t d = 0;
    if (t < T_) {
      const T* s = x + (b * T_ + t) * stride + col + h * D;
      for (; d < D; ++d) r[d] = Eng::template in<T>(s[d]);
    }
    for (; d < Dp; ++d) r[d] = E{};
  }
}

// x[(b*T + i0 + r) * stride + col + h*D + :D] <- blk[r][:D], rows inside T only.
template <class T>
void scatter_block(T* x, const float* blk, int64_t b, int64_t h, int64_t i0, int64_t T_, int64_t D,
                   int64_t Dp, int64_t stride, int64_t col) {
  for (int64_t r = 0; r < kTile && i0 + r < T_; ++r) {
    T* d = x + (b * T_ + i0 + r) * stride + col + h * D;
    for (int64_t x_ = 0; x_ < D; ++x_) d[x_] = from_f32<T>(blk[r * Dp + x_]);
  }
}

// The parallel loops' items are (head, split) pairs: see attention_splits_per_head (B H = 64 in both
// bench models: whole heads).
int64_t splits_per_head(int64_t BH, int64_t tiles) {
  return attention_splits_per_head(BH, tiles * kTile, omp_get_max_threads());
}

// The split that owns tile t: tiles are dealt in a snake (0, 1, .., s-1, s-1, .., 0, 0, 1, ..), so
// the forward's strips, which grow with t, give every split the same work to within one strip. (The
// backward's key strip of tile t and query strip of tile t together cover all keys: any deal balances.)
int64_t split_of(int64_t t, int64_t splits) {
  const int64_t p = t % (2 * splits);
  return p < splits ? p : 2 * splits - 1 - p;
}

template <class T, class Eng>
void forward_impl(T* out, float* lse, const T* qkv, int64_t B, int64_t T_, int64_t H, int64_t D, Workspace& ws) {
  using E = typename Eng::E;
  const AttentionScratch plan = attention_scratch(T_, D, std::is_base_of_v<PackedBf16Operands, Eng>);
  const int64_t C = H * D, BH = B * H, Tp = plan.Tp, Dp = plan.Dp, tiles = Tp / kTile;
  const int64_t splits = splits_per_head(BH, tiles);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const int64_t per_thread = plan.forward_thread_floats();
  float* thread_scratch = ws.floats(per_thread * omp_get_max_threads(), AttentionScratch::kThread);
#pragma omp parallel
  {
    float* S = thread_scratch + per_thread * omp_get_thread_num();   // [32][e] FP32
    E* P = reinterpret_cast<E*>(S + plan.fstrip_floats);             // [32][e]
    float* O = S + plan.fstrip_floats + plan.strip_floats;           // [32][Dp]
    E* q = reinterpret_cast<E*>(O + plan.block_floats);              // this head's operands, [Tp][Dp] each
    E* kt = q + plan.head_floats * 4 / static_cast<int64_t>(sizeof(E));
    E* vn = kt + plan.head_floats * 4 / static_cast<int64_t>(sizeof(E));
    E* rows = vn + plan.head_floats * 4 / static_cast<int64_t>(sizeof(E));
    int64_t packed = -1;  // the head whose operands q, kt and vn hold
    Eng::begin();
    // Heads are independent and of equal work: each item packs its head's operands into the
    // thread's own scratch, where they stay in L2 for all of its tiles.
#pragma omp for schedule(dynamic)
    for (int64_t item = 0; item < BH * splits; ++item) {
      const int64_t bh = item / splits, split = item % splits, b = bh / H, h = bh % H;
      if (bh != packed) {  // operands: q rows, k^T and v packed
        gather_head<Eng>(q, qkv, b, h, T_, D, Tp, Dp, 3 * C, 0);
        gather_head<Eng>(rows, qkv, b, h, T_, D, Tp, Dp, 3 * C, C);
        Eng::pack_transposed(kt, rows, Tp, Dp);
        gather_head<Eng>(rows, qkv, b, h, T_, D, Tp, Dp, 3 * C, 2 * C);
        Eng::pack_normal(vn, rows, Tp, Dp);
        packed = bh;
      }
      for (int64_t it = 0; it < tiles; ++it) {
        if (split_of(it, splits) != split) continue;
        const int64_t i0 = it * kTile, e = i0 + kTile;
        for (int64_t n0 = 0; n0 < e; n0 += kTile)  // S = q_i k[0:e]^T
          Eng::block(S + n0, e, q + i0 * Dp, Dp, kt, Dp, Tp, 0, n0, Dp);
        for (int64_t r = 0; r < kTile; ++r) {
          const int64_t i = i0 + r;
          float* s = S + r * e;
          E* p = P + r * e;
          if (i >= T_) {  // a padding row of the last tile: zero probabilities, nothing written
            for (int64_t j = 0; j < e; ++j) p[j] = E{};
            continue;
          }
          const float m = max_f32(s, i + 1);
          const float sum = exp_sum_scaled(s, scale, m, i + 1);  // S becomes the unnormalised probabilities
          // P is normalised before it is rounded: the rounding PyTorch's BF16 attention applies
          // (rounding exp(s - m) and dividing o by l after the product moved a BF16 model's loss by
          // 2e-5 against it).
          const float inv = 1.0f / sum;
#pragma omp simd
          for (int64_t j = 0; j <= i; ++j) s[j] *= inv;
          Eng::template strip_row<T>(s, p, i + 1);
          for (int64_t j = i + 1; j < e; ++j) p[j] = E{};
          lse[bh * T_ + i] = scale * m + std::log(sum);  // [B, H, T]
        }
        for (int64_t d0 = 0; d0 < Dp; d0 += kTile)  // o_i = P v[0:e]
          Eng::block(O + d0, Dp, P, e, vn, Tp, Dp, 0, d0, e);
        scatter_block(out, O, b, h, i0, T_, D, Dp, C, 0);
      }
    }
    Eng::end();
  }
}

template <class T, class Eng>
void backward_impl(T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse, int64_t B, int64_t T_, int64_t H,
                   int64_t D, Workspace& ws) {
  using E = typename Eng::E;
  const AttentionScratch plan = attention_scratch(T_, D, std::is_base_of_v<PackedBf16Operands, Eng>);
  const int64_t C = H * D, BH = B * H, Tp = plan.Tp, Dp = plan.Dp, tiles = Tp / kTile;
  const int64_t splits = splits_per_head(BH, tiles);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const int64_t per_thread = plan.backward_thread_floats();
  float* thread_scratch = ws.floats(per_thread * omp_get_max_threads(), AttentionScratch::kThread);
#pragma omp parallel
  {
    float* S = thread_scratch + per_thread * omp_get_thread_num();  // [32][n] FP32: S, then S^T
    float* dP = S + plan.fstrip_floats;                              // [32][n] FP32
    E* P = reinterpret_cast<E*>(dP + plan.fstrip_floats);            // [32][n]
    E* dS = reinterpret_cast<E*>(dP + plan.fstrip_floats + plan.strip_floats);
    float* O = dP + plan.fstrip_floats + 2 * plan.strip_floats;      // [32][Dp]
    float* delta = O + plan.block_floats;                            // [Tp], 0 on padding
    float* lse_p = delta + Tp;                                       // [Tp], +inf on padding
    E* operands = reinterpret_cast<E*>(lse_p + Tp);                  // this head's, [Tp][Dp] each
    const int64_t op = plan.head_floats * 4 / static_cast<int64_t>(sizeof(E));  // operand stride in elements
    E *q = operands, *k = q + op, *v = k + op, *dO = v + op;
    E *qT = dO + op, *kT = qT + op, *vT = kT + op, *doT = vT + op;
    E *qN = doT + op, *kN = qN + op, *doN = kN + op;
    E* kR = doN + op;                                                // k^T as rows [Dp][Tp]
    E* dsT = kR + op;                                                // a key tile's dS^T as a B operand
    float* dqT = reinterpret_cast<float*>(dsT + plan.strip_floats * 4 / static_cast<int64_t>(sizeof(E)));  // [Dp][Tp]
    int64_t packed = -1;  // the head whose operands and statistics the scratch holds
    Eng::begin();
    // As in the forward, an item packs its head into the thread's scratch (L2), then runs the key
    // pass over its tiles (and, for a head split over threads, the query pass).
#pragma omp for schedule(dynamic)
    for (int64_t item = 0; item < BH * splits; ++item) {
      const int64_t bh = item / splits, split = item % splits, b = bh / H, h = bh % H;
      if (bh != packed) {
        gather_head<Eng>(q, qkv, b, h, T_, D, Tp, Dp, 3 * C, 0);
        gather_head<Eng>(k, qkv, b, h, T_, D, Tp, Dp, 3 * C, C);
        gather_head<Eng>(v, qkv, b, h, T_, D, Tp, Dp, 3 * C, 2 * C);
        gather_head<Eng>(dO, dout, b, h, T_, D, Tp, Dp, C, 0);
        Eng::pack_transposed(qT, q, Tp, Dp);  // the key pass's B operands
        Eng::pack_transposed(doT, dO, Tp, Dp);
        Eng::pack_normal(qN, q, Tp, Dp);
        Eng::pack_normal(doN, dO, Tp, Dp);
        if (splits == 1) {  // whole head: dq^T accumulates in the key pass
          Eng::transpose_rows(kR, k, Tp, Dp);
          std::fill(dqT, dqT + Dp * Tp, 0.0f);
        } else {  // split head: the query pass's operands
          Eng::pack_transposed(kT, k, Tp, Dp);
          Eng::pack_transposed(vT, v, Tp, Dp);
          Eng::pack_normal(kN, k, Tp, Dp);
        }
        for (int64_t i = 0; i < Tp; ++i) {  // delta_i = do_i . o_i in FP32 from the stored values
          float dl = 0.0f;
          if (i < T_) {
            const T* g = dout + (b * T_ + i) * C + h * D;
            const T* o = out + (b * T_ + i) * C + h * D;
            for (int64_t x = 0; x < D; ++x) dl += to_f32(g[x]) * to_f32(o[x]);
          }
          delta[i] = dl;
          lse_p[i] = i < T_ ? lse[bh * T_ + i] : INFINITY;  // exp(s S - inf) = 0 on padding
        }
        packed = bh;
      }
      // Key pass: dv, dk (and a whole head's dq^T) of key tile j from the queries j0..Tp-1 (queries
      // past T have lse = +inf, so P^T = 0 there).
      for (int64_t jt = 0; jt < tiles; ++jt) {
        if (split_of(jt, splits) != split) continue;
        const int64_t j0 = jt * kTile, n = Tp - j0;
        for (int64_t n0 = 0; n0 < n; n0 += kTile) {
          Eng::block(S + n0, n, k + j0 * Dp, Dp, qT, Dp, Tp, 0, j0 + n0, Dp);    // S^T = k_j q^T
          Eng::block(dP + n0, n, v + j0 * Dp, Dp, doT, Dp, Tp, 0, j0 + n0, Dp);  // dP^T = v_j do^T
        }
        const float* l = lse_p + j0;
        const float* dl = delta + j0;
        // P^T and dS^T are formed in FP32 in place of S^T and dP^T, then rounded a row at a time.
        for (int64_t r = 0; r < kTile; ++r) {  // key j = j0 + r sees queries j..: columns c >= r
          float* s = S + r * n;
          float* dp = dP + r * n;
          E* p = P + r * n;
          E* ds = dS + r * n;
          const int64_t first = j0 + r < T_ ? r : n;  // a padding key: an all-zero row
          for (int64_t c = 0; c < first; ++c) p[c] = ds[c] = E{};
          exp_scaled_minus(s + first, scale, l + first, n - first);
          Eng::template strip_row<T>(s + first, p + first, n - first);
#pragma omp simd
          for (int64_t c = first; c < n; ++c) dp[c] = Eng::value(p[c]) * (dp[c] - dl[c]) * scale;
          Eng::template strip_row<T>(dp + first, ds + first, n - first);
        }
        for (int64_t d0 = 0; d0 < Dp; d0 += kTile) Eng::block(O + d0, Dp, P, n, doN, Tp, Dp, j0, d0, n);  // dv_j
        scatter_block(dqkv, O, b, h, j0, T_, D, Dp, 3 * C, 2 * C);
        for (int64_t d0 = 0; d0 < Dp; d0 += kTile) Eng::block(O + d0, Dp, dS, n, qN, Tp, Dp, j0, d0, n);  // dk_j
        scatter_block(dqkv, O, b, h, j0, T_, D, Dp, 3 * C, C);
        if (splits == 1) {  // dq^T[:, j0:] += k_j^T dS^T_j, the tile's 32 keys as K (see the header)
          Eng::pack_normal(dsT, dS, kTile, n);
          for (int64_t n0 = 0; n0 < n; n0 += kTile)
            for (int64_t d0 = 0; d0 < Dp; d0 += kTile)
              Eng::block(dqT + d0 * Tp + j0 + n0, Tp, kR + d0 * Tp + j0, Tp, dsT, kTile, n, 0, n0, kTile, true);
        }
      }
      if (splits == 1) {  // dq = (dq^T)^T, a query tile at a time
        for (int64_t i0 = 0; i0 < Tp; i0 += kTile) {
          for (int64_t d = 0; d < Dp; ++d)  // rows of dq^T read whole, columns of O written
            for (int64_t r = 0; r < kTile; ++r) O[r * Dp + d] = dqT[d * Tp + i0 + r];
          scatter_block(dqkv, O, b, h, i0, T_, D, Dp, 3 * C, 0);
        }
        continue;
      }
      // Query pass (a head split over threads): dq of query tile i from the keys 0..e-1.
      for (int64_t it = 0; it < tiles; ++it) {
        if (split_of(it, splits) != split) continue;
        const int64_t i0 = it * kTile, e = i0 + kTile;
        for (int64_t n0 = 0; n0 < e; n0 += kTile) {
          Eng::block(S + n0, e, q + i0 * Dp, Dp, kT, Dp, Tp, 0, n0, Dp);    // S = q_i k^T
          Eng::block(dP + n0, e, dO + i0 * Dp, Dp, vT, Dp, Tp, 0, n0, Dp);  // dP = do_i v^T
        }
        // As in the key pass: P (rounded into P's buffer, which this pass does not otherwise use)
        // and dS in FP32 in place of S and dP, rounded a row at a time.
        for (int64_t r = 0; r < kTile; ++r) {
          const int64_t i = i0 + r;
          float* s = S + r * e;
          float* dp = dP + r * e;
          E* p = P + r * e;
          E* ds = dS + r * e;
          const int64_t count = i < T_ ? i + 1 : 0;  // padding rows: all zero
          const float l = lse_p[i], dl = delta[i];
          exp_scaled_minus(s, scale, l, count);
          Eng::template strip_row<T>(s, p, count);
#pragma omp simd
          for (int64_t j = 0; j < count; ++j) dp[j] = Eng::value(p[j]) * (dp[j] - dl) * scale;
          Eng::template strip_row<T>(dp, ds, count);
          for (int64_t j = count; j < e; ++j) ds[j] = E{};
        }
        for (int64_t d0 = 0; d0 < Dp; d0 += kTile) Eng::block(O + d0, Dp, dS, e, kN, Tp, Dp, 0, d0, e);  // dq_i
        scatter_block(dqkv, O, b, h, i0, T_, D, Dp, 3 * C, 0);
      }
    }
    Eng::end();
  }
}

}  // namespace

AttentionEngine attention_engine(bool bf16_operands) {
  if (!bf16_operands) return AttentionEngine::Portable;
  if (amx_usable()) return AttentionEngine::Amx;
  return avx512_bf16_usable() ? AttentionEngine::Avx512Bf16 : AttentionEngine::Portable;
}

template <class T>
void attention_forward(T* out, float* lse, const T* qkv, int64_t B, int64_t T_, int64_t H, int64_t D,
                       AttentionEngine engine, Workspace& ws) {
  if constexpr (std::is_same_v<T, bf16>) {
    if (engine == AttentionEngine::Amx) return forward_impl<T, AmxEngine>(out, lse, qkv, B, T_, H, D, ws);
    if (engine == AttentionEngine::Avx512Bf16) return forward_impl<T, Avx512Bf16Engine>(out, lse, qkv, B, T_, H, D, ws);
  } else if (engine != AttentionEngine::Portable) {
    throw std::invalid_argument("attention_forward: the AMX and AVX512_BF16 engines take BF16 tensors");
  }
  forward_impl<T, PortableEngine>(out, lse, qkv, B, T_, H, D, ws);
}

template <class T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse, int64_t B, int64_t T_,
                        int64_t H, int64_t D, AttentionEngine engine, Workspace& ws) {
  if constexpr (std::is_same_v<T, bf16>) {
    if (engine == AttentionEngine::Amx) return backward_impl<T, AmxEngine>(dqkv, dout, qkv, out, lse, B, T_, H, D, ws);
    if (engine == AttentionEngine::Avx512Bf16)
      return backward_impl<T, Avx512Bf16Engine>(dqkv, dout, qkv, out, lse, B, T_, H, D, ws);
  } else if (engine != AttentionEngine::Portable) {
    throw std::invalid_argument("attention_backward: the AMX and AVX512_BF16 engines take BF16 tensors");
  }
  backward_impl<T, PortableEngine>(dqkv, dout, qkv, out, lse, B, T_, H, D, ws);
}

template void attention_forward<float>(float*, float*, const float*, int64_t, int64_t, int64_t, int64_t, AttentionEngine, Workspace&);
template void attention_forward<bf16>(bf16*, float*, const bf16*, int64_t, int64_t, int64_t, int64_t, AttentionEngine, Workspace&);
template void attention_backward<float>(float*, const float*, const float*, const float*, const float*, int64_t, int64_t,
                                        int64_t, int64_t, AttentionEngine, Workspace&);
template void attention_backward<bf16>(bf16*, const bf16*, const bf16*, const bf16*, const float*, int64_t, int64_t,
                                       int64_t, int64_t, AttentionEngine, Workspace&);

}  // namespace multinorm::cpu
