// Causal multi-head attention on qkv[B*T, 3*H*D] (row layout [q heads | k heads | v heads], q and k
// already rotated), one (batch, head) pair per task. Scale s = 1/sqrt(D).
// Forward, for each query i:   p_ij = softmax_j<=i(s q_i.k_j),   o_i = sum_j p_ij v_j,
//                              lse_i = log sum_j<=i exp(s q_i.k_j)   (saved for the backward pass)
// Backward recomputes p_ij = exp(s q_i.k_j - lse_i) (FlashAttention's trick: no T x T storage):
//   D_i = do_i . o_i,  dv_j += p_ij do_i,  ds_ij = p_ij (do_i . v_j - D_i),
//   dq_i += s ds_ij k_j,  dk_j += s ds_ij q_i
// The head's q, k, v (and o, do) are first gathered into contiguous FP32 tiles of T x D.
#include <cmath>

#include "cpu_kernels.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace multinorm::cpu {

namespace {

inline int thread_id() {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}
inline int thread_count() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

inline float dot(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// Gathers the head at column offset `col` of rows b*T .. b*T+T-1 (row stride `stride`) into tile[T, D].
template <class T>
void gather(float* tile, const T* src, int64_t b, int64_t T_, int64_t D, int64_t stride, int64_t col) {
  for (int64_t t = 0; t < T_; ++t) {
    const T* row = src + (b * T_ + t) * stride + col;
    for (int64_t d = 0; d < D; ++d) tile[t * D + d] = to_f32(row[d]);
  }
}

template <class T>
void scatter(T* dst, const float* tile, int64_t b, int64_t T_, int64_t D, int64_t stride, int64_t col) {
  for (int64_t t = 0; t < T_; ++t) {
    T* row = dst + (b * T_ + t) * stride + col;
    for (int64_t d = 0; d < D; ++d) row[d] = from_f32<T>(tile[t * D + d]);
  }
}

}  // namespace

template <class T>
void attention_forward(T* out, float* lse, const T* qkv, int64_t B, int64_t T_, int64_t H, int64_t D, Workspace& ws) {
  const int64_t C = H * D;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const int64_t per_thread = 4 * T_ * D + T_;  // q, k, v, o tiles + one score row
  float* scratch = ws.floats(static_cast<size_t>(per_thread) * thread_count());
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      float* q = scratch + thread_id() * per_thread;
      float *k = q + T_ * D, *v = k + T_ * D, *o = v + T_ * D, *p = o + T_ * D;
      gather(q, qkv, b, T_, D, 3 * C, h * D);
      gather(k, qkv, b, T_, D, 3 * C, C + h * D);
      gather(v, qkv, b, T_, D, 3 * C, 2 * C + h * D);
      for (int64_t i = 0; i < T_; ++i) {
        const float* qi = q + i * D;
        float m = -INFINITY;
        for (int64_t j = 0; j <= i; ++j) {
          p[j] = scale * dot(qi, k + j * D, D);
          m = std::max(m, p[j]);
        }
        float sum = 0.0f;
        for (int64_t j = 0; j <= i; ++j) {
          p[j] = std::exp(p[j] - m);
          sum += p[j];
        }
        const float inv = 1.0f / sum;
        float* oi = o + i * D;
        for (int64_t d = 0; d < D; ++d) oi[d] = 0.0f;
        for (int64_t j = 0; j <= i; ++j) {
          const float pj = p[j] * inv;
          const float* vj = v + j * D;
#pragma omp simd
          for (int64_t d = 0; d < D; ++d) oi[d] += pj * vj[d];
        }
        lse[(b * H + h) * T_ + i] = m + std::log(sum);
      }
      scatter(out, o, b, T_, D, C, h * D);
    }
  }
}

template <class T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse, int64_t B, int64_t T_,
                        int64_t H, int64_t D, Workspace& ws) {
  const int64_t C = H * D;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const int64_t per_thread = 8 * T_ * D + T_;  // q k v o do dq dk dv tiles + delta
  float* scratch = ws.floats(static_cast<size_t>(per_thread) * thread_count());
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      float* q = scratch + thread_id() * per_thread;
      float *k = q + T_ * D, *v = k + T_ * D, *o = v + T_ * D, *dO = o + T_ * D;
      float *dq = dO + T_ * D, *dk = dq + T_ * D, *dv = dk + T_ * D, *delta = dv + T_ * D;
      gather(q, qkv, b, T_, D, 3 * C, h * D);
      gather(k, qkv, b, T_, D, 3 * C, C + h * D);
      gather(v, qkv, b, T_, D, 3 * C, 2 * C + h * D);
      gather(o, out, b, T_, D, C, h * D);
      gather(dO, dout, b, T_, D, C, h * D);
      for (int64_t x = 0; x < 3 * T_ * D; ++x) dq[x] = 0.0f;  // dq, dk, dv are contiguous
      for (int64_t i = 0; i < T_; ++i) delta[i] = dot(dO + i * D, o + i * D, D);
      const float* lse_bh = lse + (b * H + h) * T_;
      for (int64_t i = 0; i < T_; ++i) {
        const float* qi = q + i * D;
        const float* doi = dO + i * D;
        float* dqi = dq + i * D;
        for (int64_t j = 0; j <= i; ++j) {
          const float* kj = k + j * D;
          const float p = std::exp(scale * dot(qi, kj, D) - lse_bh[i]);
          const float ds = p * (dot(doi, v + j * D, D) - delta[i]) * scale;
          float* dkj = dk + j * D;
          float* dvj = dv + j * D;
#pragma omp simd
          for (int64_t d = 0; d < D; ++d) {
            dvj[d] += p * doi[d];
            dqi[d] += ds * kj[d];
            dkj[d] += ds * qi[d];
          }
        }
      }
      scatter(dqkv, dq, b, T_, D, 3 * C, h * D);
      scatter(dqkv, dk, b, T_, D, 3 * C, C + h * D);
      scatter(dqkv, dv, b, T_, D, 3 * C, 2 * C + h * D);
    }
  }
}

template void attention_forward<float>(float*, float*, const float*, int64_t, int64_t, int64_t, int64_t, Workspace&);
template void attention_forward<bf16>(bf16*, float*, const bf16*, int64_t, int64_t, int64_t, int64_t, Workspace&);
template void attention_backward<float>(float*, const float*, const float*, const float*, const float*, int64_t,
                                        int64_t, int64_t, int64_t, Workspace&);
template void attention_backward<bf16>(bf16*, const bf16*, const bf16*, const bf16*, const float*, int64_t, int64_t,
                                       int64_t, int64_t, Workspace&);

}  // namespace multinorm::cpu
