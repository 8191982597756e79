// Causal multi-head attention on qkv[B*T, 3*H*D] (row layout [q heads | k heads | v heads], q and k
// already rotated), as batched GEMMs over the B*H heads plus row kernels. Scale s = 1/sqrt(D).
//   Forward:   S = q k^T            P = causal_softmax(s S)          o = P v
//              lse_i = log sum_j<=i exp(s S_ij)   (saved: the backward pass recomputes P from it)
//   Backward:  P = exp(s S - lse) (masked)        dv = P^T do        dP = do v^T
//              delta_i = do_i . o_i               dS = P (dP - delta) s
//              dq = dS k                          dk = dS^T q
// Heads are gathered into contiguous [B*H, T, D] tiles (so oneDNN runs plain batched GEMMs) and the
// results scattered back. P and dS are stored in the model dtype, as PyTorch's bf16 attention does.
// S costs a full T x T per head (the causal half is computed and masked): GEMM speed beats the
// saving at these sizes.
#include <cmath>

#include "../common/fast_math.h"
#include "cpu_kernels.h"
#include "matmul_onednn.h"

namespace multinorm::cpu {

namespace {

// Workspace slots used here.
enum Slot : size_t { kQ = 1, kK, kV, kO, kDO, kS, kP, kF1, kF2, kF3 };

template <class T>
Buf buf(T* p) {
  return {p, std::is_same_v<T, float> ? DType::F32 : DType::BF16};
}

// dst[(b*H + h), t, :] = src[(b*T + t) * stride + col + h*D + :]
template <class TD, class TS>
void gather_heads(TD* dst, const TS* src, int64_t B, int64_t T_, int64_t H, int64_t D, int64_t stride, int64_t col) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T_; ++t)
      for (int64_t h = 0; h < H; ++h) {
        const TS* s = src + (b * T_ + t) * stride + col + h * D;
        TD* d = dst + ((b * H + h) * T_ + t) * D;
        for (int64_t x = 0; x < D; ++x) d[x] = from_f32<TD>(to_f32(s[x]));
      }
}

template <class TD>
void scatter_heads(TD* dst, const float* src, int64_t B, int64_t T_, int64_t H, int64_t D, int64_t stride, int64_t col) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T_; ++t)
      for (int64_t h = 0; h < H; ++h) {
        const float* s = src + ((b * H + h) * T_ + t) * D;
        TD* d = dst + (b * T_ + t) * stride + col + h * D;
        for (int64_t x = 0; x < D; ++x) d[x] = from_f32<TD>(s[x]);
      }
}

}  // namespace

template <class T>
void attention_forward(T* out, float* lse, const T* qkv, int64_t B, int64_t T_, int64_t H, int64_t D, OneDnnMatmul& gemm,
                       Workspace& ws) {
  const int64_t C = H * D, BH = B * H, TD = T_ * D, TT = T_ * T_;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  T* q = ws.as<T>(BH * TD, kQ);
  T* k = ws.as<T>(BH * TD, kK);
  T* v = ws.as<T>(BH * TD, kV);
  float* S = ws.floats(BH * TT, kS);
  T* P = ws.as<T>(BH * TT, kP);
  float* O = ws.floats(BH * TD, kF1);
  gather_heads(q, qkv, B, T_, H, D, 3 * C, 0);
  gather_heads(k, qkv, B, T_, H, D, 3 * C, C);
  gather_heads(v, qkv, B, T_, H, D, 3 * C, 2 * C);
  gemm.run_batched(Buf{S, DType::F32}, buf(q), buf(k), BH, T_, T_, D, false, true, false);  // S = q k^T
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < BH * T_; ++r) {  // row i of head bh: keys 0..i
    const int64_t i = r % T_;
    float* s = S + r * T_;
    T* p = P + r * T_;
    float m = -INFINITY;
#pragma omp simd reduction(max : m)
    for (int64_t j = 0; j <= i; ++j) m = std::max(m, s[j]);
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j <= i; ++j) {
      s[j] = exp_f32(scale * (s[j] - m));  // S becomes the unnormalised probabilities
      sum += s[j];
    }
    const float inv = 1.0f / sum;
#pragma omp simd
    for (int64_t j = 0; j <= i; ++j) p[j] = from_f32<T>(s[j] * inv);
    for (int64_t j = i + 1; j < T_; ++j) p[j] = from_f32<T>(0.0f);
    lse[r] = scale * m + std::log(sum);  // rows are (b*H + h)*T + i: lse's [B, H, T] layout
  }
  gemm.run_batched(Buf{O, DType::F32}, buf(P), buf(v), BH, T_, D, T_, false, false, false);  // o = P v
  scatter_heads(out, O, B, T_, H, D, C, 0);
}

template <class T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse, int64_t B, int64_t T_,
                        int64_t H, int64_t D, OneDnnMatmul& gemm, Workspace& ws) {
  const int64_t C = H * D, BH = B * H, TD = T_ * D, TT = T_ * T_;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  T* q = ws.as<T>(BH * TD, kQ);
  T* k = ws.as<T>(BH * TD, kK);
  T* v = ws.as<T>(BH * TD, kV);
  T* o = ws.as<T>(BH * TD, kO);
  T* dO = ws.as<T>(BH * TD, kDO);
  float* S = ws.floats(BH * TT, kS);  // S, then dP
  T* P = ws.as<T>(BH * TT, kP);       // P, then dS
  float* dq = ws.floats(BH * TD, kF1);
  float* dk = ws.floats(BH * TD, kF2);
  float* dv = ws.floats(BH * TD, kF3);
  gather_heads(q, qkv, B, T_, H, D, 3 * C, 0);
  gather_heads(k, qkv, B, T_, H, D, 3 * C, C);
  gather_heads(v, qkv, B, T_, H, D, 3 * C, 2 * C);
  gather_heads(o, out, B, T_, H, D, C, 0);
  gather_heads(dO, dout, B, T_, H, D, C, 0);
  gemm.run_batched(Buf{S, DType::F32}, buf(q), buf(k), BH, T_, T_, D, false, true, false);  // S = q k^T
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < BH * T_; ++r) {  // P = exp(s S - lse), 0 above the diagonal
    const int64_t i = r % T_;
    const float* s = S + r * T_;
    T* p = P + r * T_;
    const float l = lse[r];
#pragma omp simd
    for (int64_t j = 0; j <= i; ++j) p[j] = from_f32<T>(exp_f32(scale * s[j] - l));
    for (int64_t j = i + 1; j < T_; ++j) p[j] = from_f32<T>(0.0f);
  }
  gemm.run_batched(Buf{dv, DType::F32}, buf(P), buf(dO), BH, T_, D, T_, true, false, false);  // dv = P^T do
  gemm.run_batched(Buf{S, DType::F32}, buf(dO), buf(v), BH, T_, T_, D, false, true, false);  // dP = do v^T
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < BH * T_; ++r) {  // dS = P (dP - delta) s, delta = do . o
    const int64_t i = r % T_;
    float delta = 0.0f;
#pragma omp simd reduction(+ : delta)
    for (int64_t x = 0; x < D; ++x) delta += to_f32(dO[r * D + x]) * to_f32(o[r * D + x]);
    const float* dp = S + r * T_;
    T* p = P + r * T_;
#pragma omp simd
    for (int64_t j = 0; j <= i; ++j) p[j] = from_f32<T>(to_f32(p[j]) * (dp[j] - delta) * scale);
  }
  gemm.run_batched(Buf{dq, DType::F32}, buf(P), buf(k), BH, T_, D, T_, false, false, false);  // dq = dS k
  gemm.run_batched(Buf{dk, DType::F32}, buf(P), buf(q), BH, T_, D, T_, true, false, false);   // dk = dS^T q
  scatter_heads(dqkv, dq, B, T_, H, D, 3 * C, 0);
  scatter_heads(dqkv, dk, B, T_, H, D, 3 * C, C);
  scatter_heads(dqkv, dv, B, T_, H, D, 3 * C, 2 * C);
}

template void attention_forward<float>(float*, float*, const float*, int64_t, int64_t, int64_t, int64_t, OneDnnMatmul&,
                                       Workspace&);
template void attention_forward<bf16>(bf16*, float*, const bf16*, int64_t, int64_t, int64_t, int64_t, OneDnnMatmul&,
                                      Workspace&);
template void attention_backward<float>(float*, const float*, const float*, const float*, const float*, int64_t,
                                        int64_t, int64_t, int64_t, OneDnnMatmul&, Workspace&);
template void attention_backward<bf16>(bf16*, const bf16*, const bf16*, const bf16*, const float*, int64_t, int64_t,
                                       int64_t, int64_t, OneDnnMatmul&, Workspace&);

}  // namespace multinorm::cpu
