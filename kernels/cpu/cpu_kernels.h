// CPU kernels of the model's ops: plain loops over rows, heads and tokens, threaded with OpenMP,
// templated on the storage type T (float or bf16) with FP32 arithmetic. Each kernel's contract is
// the matching Backend op in include/multinorm/backend.h; shapes are given there and in the
// comments of each file. Kernels never allocate: scratch comes from the caller's Workspace.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "../common/bf16.h"
#include "../common/rounding.h"
#include "multinorm/backend.h"

namespace multinorm::cpu {

// Grow-only scratch owned by the backend: sized on the first step, reused after (no allocation on
// the hot path in steady state).
// `slot` names independent regions, so one op can hold several scratch buffers at once.
class Workspace {
 public:
  float* floats(size_t n, size_t slot = 0) {
    if (f_.size() <= slot) f_.resize(slot + 1);
    if (f_[slot].size() < n) f_[slot].resize(n);
    return f_[slot].data();
  }
  template <class T>
  T* as(size_t n, size_t slot) {  // n elements of T (float or bf16)
    return reinterpret_cast<T*>(floats((n * sizeof(T) + 3) / 4, slot));
  }
  int32_t* ints(size_t n) {
    if (i_.size() < n) i_.resize(n);
    return i_.data();
  }
  int64_t bytes() const {  // what the slots hold now (memory accounting)
    size_t n = i_.size();
    for (const auto& f : f_) n += f.size();
    return static_cast<int64_t>(n) * 4;
  }

 private:
  std::vector<std::vector<float>> f_;
  std::vector<int32_t> i_;
};

class OneDnnMatmul;

template <class T> void embedding_forward(T* out, const int32_t* tokens, const T* wte, int64_t BT, int64_t C);
template <class T, class G> void embedding_backward(G* dwte, const T* dout, const int32_t* tokens, int64_t BT, int64_t C, Workspace& ws);

template <class T> void rmsnorm_forward(T* out, float* rstd, const T* x, const T* w, int64_t N, int64_t C, float eps);
template <class T, class G> void rmsnorm_backward(float* dx, G* dw, const float* dout, const T* x, const T* w, const float* rstd,
                                         int64_t N, int64_t C, bool accumulate_dx, Workspace& ws);

template <class T> void rope_forward(T* qkv, const float* cos_sin, int64_t B, int64_t T_, int64_t H, int64_t D, bool inverse);

template <class T> void attention_forward(T* out, float* lse, const T* qkv, int64_t B, int64_t T_, int64_t H, int64_t D,
                                          OneDnnMatmul& gemm, Workspace& ws);
template <class T> void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse,
                                           int64_t B, int64_t T_, int64_t H, int64_t D, OneDnnMatmul& gemm, Workspace& ws);

template <class T> void attention_decode(T* out, const T* qkv, T* k_cache, T* v_cache, int64_t pos, int64_t H, int64_t D,
                                         Workspace& ws);

template <class T> void swiglu_forward(T* out, const T* gate_up, int64_t N, int64_t F);
template <class T> void swiglu_backward(T* dgate_up, const T* dout, const T* gate_up, int64_t N, int64_t F);

template <class T> void cross_entropy(float* losses, T* dlogits, const float* logits, const int32_t* targets,
                                      const uint8_t* mask, int64_t N, int64_t V, float grad_scale);

template <class TO, class TI> void convert(TO* dst, const TI* src, int64_t n);

// Optimizer kernels (contracts: the Backend optimizer ops).
// T: weights, G: gradients (the same, or FP32 gradients with BF16 weights), S: optimizer states.
// SWAN reports the Newton-Schulz residual ||I - Z Y||_F / sqrt(k) of its final iterate (0 on the
// exact path) and whether a diverged iteration fell back to the exact path.
struct SwanReport {
  double residual = 0;
  bool fell_back = false;
};
// SinkGD's column sums go through this many chunks of rows (about 64 rows each, at most 64): a
// function of m alone, so the result does not depend on the thread count. Its scratch: u (m), v (n),
// chunks x n partial sums, one FP32 row of n per thread.
inline int64_t sinkgd_chunks(int64_t m) { return std::min<int64_t>(64, std::max<int64_t>(1, (m + 63) / 64)); }
template <class T, class G> void sinkgd_update(T* w, const G* g, int64_t m, int64_t n, const SinkGDArgs& a, Workspace& ws);
template <class T, class G> SwanReport swan_update(T* w, const G* g, int64_t m, int64_t n, const SwanArgs& a, OneDnnMatmul& gemm, Workspace& ws);
template <class T, class G, class S> void adam_update(T* w, const G* g, S* m, S* v, int64_t n, const AdamArgs& a);
template <class T, class G, class S> void sgd_update(T* w, const G* g, S* buf, int64_t n, const SgdArgs& a);
template <class T> double sum_squares(const T* x, int64_t n);
template <class T> void scale(T* x, int64_t n, float factor);

}  // namespace multinorm::cpu
