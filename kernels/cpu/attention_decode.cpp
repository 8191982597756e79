// Causal attention of ONE new position against a key/value cache (incremental decoding, batch 1).
//   qkv [3*H*D]: this position's row, q and k already rotated (RoPE at position `pos`)
//   k_cache, v_cache [max_T, H*D]: rows 0 .. pos-1 hold the earlier positions; row pos is written here
//   out [H*D]:   per head h, out_h = sum_j<=pos softmax_j(s q_h . k_jh) v_jh, s = 1/sqrt(D)
// FP32 arithmetic, one pass per head over the cache: O(pos * C) reads, no T x T anything. The same
// math as the training kernel (attention.cpp) row by row, so decoding with the cache reproduces the
// full forward's last row (tests/test_model.cpp).
#include <cmath>
#include <vector>

#include "../common/fast_math.h"
#include "cpu_kernels.h"

namespace multinorm::cpu {

namespace {
constexpr size_t kDecodeScoresSlot = 13;  // Workspace slot (attention uses 1, embedding 12)
}  // namespace

template <class T>
void attention_decode(T* out, const T* qkv, T* k_cache, T* v_cache, int64_t pos, int64_t H, int64_t D, Workspace& ws) {
  const int64_t C = H * D;
  for (int64_t c = 0; c < C; ++c) {  // append this position's k and v
    k_cache[pos * C + c] = qkv[C + c];
    v_cache[pos * C + c] = qkv[2 * C + c];
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  float* scores = ws.floats(static_cast<size_t>(H * (pos + 1)), kDecodeScoresSlot);
#pragma omp parallel for schedule(static)
  for (int64_t h = 0; h < H; ++h) {
    const T* q = qkv + h * D;
    float* s = scores + h * (pos + 1);
    float top = -INFINITY;
    for (int64_t j = 0; j <= pos; ++j) {
      const T* k = k_cache + j * C + h * D;
      float dot = 0.0f;
      for (int64_t d = 0; d < D; ++d) dot += to_f32(q[d]) * to_f32(k[d]);
      s[j] = dot * scale;
      top = std::max(top, s[j]);
    }
    float sum = 0.0f;
    for (int64_t j = 0; j <= pos; ++j) sum += (s[j] = exp_f32(s[j] - top));
    const float inv = 1.0f / sum;
    for (int64_t d = 0; d < D; ++d) {
      float acc = 0.0f;
      for (int64_t j = 0; j <= pos; ++j) acc += s[j] * to_f32(v_cache[j * C + h * D + d]);
      out[h * D + d] = from_f32<T>(acc * inv);
    }
  }
}

template void attention_decode<float>(float*, const float*, float*, float*, int64_t, int64_t, int64_t, Workspace&);
template void attention_decode<bf16>(bf16*, const bf16*, bf16*, bf16*, int64_t, int64_t, int64_t, Workspace&);

}  // namespace multinorm::cpu
