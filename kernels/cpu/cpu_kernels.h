// CPU kernels of the model's ops: plain loops over rows, heads and tokens, threaded with OpenMP,
// templated on the storage type T (float or bf16) with FP32 arithmetic. Each kernel's contract is
// the matching Backend op in include/multinorm/backend.h; shapes are given there and in the
// comments of each file. Kernels never allocate: scratch comes from the caller's Workspace.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <new>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "../common/bf16.h"
#include "../common/rounding.h"
#include "multinorm/backend.h"

namespace multinorm::cpu {

// Scratch starts on a cache line: a kernel that lays its rows out at multiples of 16 floats then
// stores whole vectors into whole lines (a 64-byte store that straddles two lines cost SinkGD's
// squares a quarter of its pass on Zen 4: 0.075 -> 0.100 ns per element at a 16-byte offset).
template <class T>
struct CacheLineAllocator {
  using value_type = T;
  static constexpr std::align_val_t kAlign{64};
  CacheLineAllocator() = default;
  template <class U>
  CacheLineAllocator(const CacheLineAllocator<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), kAlign)); }
  void deallocate(T* p, size_t) { ::operator delete(p, kAlign); }
  template <class U>
  bool operator==(const CacheLineAllocator<U>&) const { return true; }
  template <class U>
  bool operator!=(const CacheLineAllocator<U>&) const { return false; }
};
// Floats to the next 64-byte boundary: offsets of regions a kernel carves from one slot.
inline int64_t cache_line_floats(int64_t n) { return (n + 15) / 16 * 16; }

// Grow-only scratch owned by the backend: sized on the first step, reused after (no allocation on
// the hot path in steady state).
// `slot` names independent regions, so one op can hold several scratch buffers at once.
class Workspace {
 public:
  float* floats(size_t n, size_t slot = 0) {
    if (f_.size() <= slot) f_.resize(slot + 1);
    // Grown to exactly n (resize may reserve up to twice), so bytes() is the memory held. The contents
    // are not kept: scratch is scratch.
    if (f_[slot].size() < n) f_[slot] = Floats(n);
    return f_[slot].data();
  }
  template <class T>
  T* as(size_t n, size_t slot) {  // n elements of T (float or bf16)
    return reinterpret_cast<T*>(floats((n * sizeof(T) + 3) / 4, slot));
  }
  int32_t* ints(size_t n) {
    if (i_.size() < n) i_ = std::vector<int32_t>(n);
    return i_.data();
  }
  int64_t bytes() const {  // what the slots hold now (memory accounting)
    size_t n = i_.size();
    for (const auto& f : f_) n += f.size();
    return static_cast<int64_t>(n) * 4;
  }

 private:
  using Floats = std::vector<float, CacheLineAllocator<float>>;
  std::vector<Floats> f_;
  std::vector<int32_t> i_;
};

class OneDnnMatmul;

// GCC 12 reports its own _mm512_undefined_* placeholders inside the AVX-512 intrinsics as
// uninitialised when they are inlined (GCC bug 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// max of x[0..n): NaN elements are passed over (x > m is false for them), -inf for n = 0.
inline float max_f32(const float* x, int64_t n) {
  int64_t i = 0;
  float m = -INFINITY;
#if defined(__AVX512F__)
  // Four vector chains, so vmaxps's latency does not bound the loop. GCC 12 leaves every portable
  // form scalar (a 16-lane array, omp simd reduction(max), std::max): vmaxss, a quarter of the
  // cross-entropy's time. _mm512_max_ps(v, acc) is v > acc ? v : acc, NaN in v passed over, exactly
  // the scalar step below; the order of the comparisons cannot change the maximum.
  __m512 m0 = _mm512_set1_ps(-INFINITY), m1 = m0, m2 = m0, m3 = m0;
  for (; i + 64 <= n; i += 64) {
    m0 = _mm512_max_ps(_mm512_loadu_ps(x + i), m0);
    m1 = _mm512_max_ps(_mm512_loadu_ps(x + i + 16), m1);
    m2 = _mm512_max_ps(_mm512_loadu_ps(x + i + 32), m2);
    m3 = _mm512_max_ps(_mm512_loadu_ps(x + i + 48), m3);
  }
  for (; i + 16 <= n; i += 16) m0 = _mm512_max_ps(_mm512_loadu_ps(x + i), m0);
  alignas(64) float lane[16];
  _mm512_store_ps(lane, _mm512_max_ps(_mm512_max_ps(m0, m1), _mm512_max_ps(m2, m3)));
  for (const float v : lane) m = v > m ? v : m;
#endif
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}
#pragma GCC diagnostic pop

template <class T> void embedding_forward(T* out, const int32_t* tokens, const T* wte, int64_t BT, int64_t C);
template <class T, class G> void embedding_backward(G* dwte, const T* dout, const int32_t* tokens, int64_t BT, int64_t C, Workspace& ws);

template <class T> void rmsnorm_forward(T* out, float* rstd, const T* x, const T* w, int64_t N, int64_t C, float eps);
template <class T, class G> void rmsnorm_backward(float* dx, G* dw, const float* dout, const T* x, const T* w, const float* rstd,
                                         int64_t N, int64_t C, bool accumulate_dx, Workspace& ws);

template <class T> void rope_forward(T* qkv, const float* cos_sin, int64_t B, int64_t T_, int64_t H, int64_t D, bool inverse);

// Blocked causal attention (attention.cpp) on one of three block-product engines: FP32 products on
// the vector units (any CPU, any T); BF16 operands (T = bf16 only) on AVX512_BF16's VDPBF16PS or on
// the AMX tiles, both in the tiles' operand layouts.
enum class AttentionEngine { Portable, Avx512Bf16, Amx };
// The fastest engine this CPU runs: AMX where amx_usable(), else AVX512_BF16, for BF16 operands.
AttentionEngine attention_engine(bool bf16_operands);
template <class T> void attention_forward(T* out, float* lse, const T* qkv, int64_t B, int64_t T_, int64_t H, int64_t D,
                                          AttentionEngine engine, Workspace& ws);
template <class T> void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse,
                                           int64_t B, int64_t T_, int64_t H, int64_t D, AttentionEngine engine,
                                           Workspace& ws);

// Attention's scratch plan, shared by the kernel and the memory estimate: all of it per thread, in
// one Workspace slot. A thread packs one head's operands at a time, padded to Tp x Dp (multiples of
// the 32 tile) in the block engine's element type (BF16 on the AMX and AVX512_BF16 engines, FP32 on
// the portable one): the forward q rows, k transposed, v normal and a gather row buffer (4), the
// backward 4 rows, 4 transposed, 3 normal and k^T as rows (12) plus the head's per-row statistics and
// its FP32 dq^T; and one set of strips: 32 query (or key) rows against every key (or query) they
// reach. At T = 1024, D = 64, BF16: 0.7 MB a thread forward, 2.3 MB backward, whatever B and H.
struct AttentionScratch {
  static constexpr size_t kThread = 1;  // the Workspace slot
  int64_t Tp, Dp, elem_bytes;
  int64_t strip_floats;    // one 32 x Tp strip in the element type, rounded to 64 bytes
  int64_t fstrip_floats;   // one 32 x Tp FP32 strip
  int64_t block_floats;    // one 32 x Dp FP32 output block
  int64_t head_floats;     // one head's Tp x Dp operand in the element type, rounded to 64 bytes
  int64_t forward_thread_floats() const { return fstrip_floats + strip_floats + block_floats + 4 * head_floats; }
  int64_t backward_thread_floats() const {
    return 2 * fstrip_floats + 3 * strip_floats + block_floats + 2 * Tp + 12 * head_floats + Dp * Tp;
  }
};
// The attention's work items: one per head when there are at least two heads per thread, else each
// head's 32-row tiles dealt to this many items (each packs the head for itself) so that every thread
// gets work. Whole heads let the backward accumulate dq in its key pass; split heads add a query
// pass that recomputes S and dP (attention.cpp). The same bits either way.
inline int64_t attention_splits_per_head(int64_t BH, int64_t T, int64_t threads) {
  const int64_t tiles = (T + 31) / 32, want = (2 * threads + BH - 1) / BH;
  return std::max<int64_t>(1, std::min(want, tiles));
}
// The share of the usual attention FLOP count (full T x T products: 2 forward, 4 backward) that the
// blocked kernel computes: over the 32-blocks on and below the diagonal, (n + 1) / (2 n) of the
// square, 7 products (2 forward; S^T, dP^T, dv, dk, dq backward) with whole heads, 9 with split
// heads (S and dP again in the query pass).
inline double attention_blocked_flops_share(int64_t T, bool split_heads) {
  const double n = static_cast<double>((T + 31) / 32);
  return (split_heads ? 9.0 : 7.0) / 6.0 * (n + 1) / (2 * n);
}
inline AttentionScratch attention_scratch(int64_t T, int64_t D, bool bf16_operands) {
  auto up = [](int64_t x, int64_t m) { return (x + m - 1) / m * m; };
  AttentionScratch s{};
  s.Tp = up(T, 32), s.Dp = up(D, 32), s.elem_bytes = bf16_operands ? 2 : 4;
  auto floats = [&](int64_t elements) { return up(elements * s.elem_bytes, 64) / 4; };
  s.strip_floats = floats(32 * s.Tp);
  s.fstrip_floats = 32 * s.Tp;
  s.block_floats = 32 * s.Dp;
  s.head_floats = floats(s.Tp * s.Dp);
  return s;
}

template <class T> void attention_decode(T* out, const T* qkv, T* k_cache, T* v_cache, int64_t pos, int64_t H, int64_t D,
                                         Workspace& ws);

// GEMMs with a fused epilogue (the packed GEMM only, BF16 operands): the GEMM's rows are formed in
// strips of 32 into per-thread FP32 strips (Workspace slot kGemmStripSlot, gemm_strip_floats(N,
// strips) per thread, `strips` = row_strips_per_pass(N, K, threads) of matmul_packed.h) and consumed
// there, never stored in FP32: the same bits as packed_matmul and then the op. Whether the CPU backend
// fuses them (asked by the backend and by the memory estimate alike): BF16 operands where
// packed_bf16_gemm_usable() (AMX tiles or AVX512_BF16). The fused ops below take strips_per_pass (0:
// row_strips_per_pass's choice; tests pass others).
struct PackedScratch;
constexpr size_t kGemmStripSlot = 15;
inline int64_t gemm_strip_floats(int64_t N, int64_t strips) { return strips * 32 * ((N + 31) / 32 * 32); }
// SwiGLU's backward strips hold a BF16 row of ds after them.
inline int64_t swiglu_backward_strip_floats(int64_t F, int64_t strips) { return gemm_strip_floats(F, strips) + (F + 31) / 32 * 16; }
bool fuses_gemm_epilogues(bool bf16_operands);

template <class T> void swiglu_forward(T* out, const T* gate_up, int64_t N, int64_t F);
template <class T> void swiglu_backward(T* dgate_up, T* out, const T* dout, const T* gate_up, int64_t N, int64_t F);
// Fused (see above): gate_up = x w^T (x [N, C], w [2F, C]) then swiglu_forward; and ds = dy w_down (dy
// [N, C], w_down [C, F]) then swiglu_backward(dgate_up, out, ds, gate_up), ds never stored.
void matmul_swiglu_packed(bf16* out, bf16* gate_up, const bf16* x, const bf16* w, int64_t N, int64_t F, int64_t C,
                          PackedScratch& packed, Workspace& ws, int64_t strips_per_pass = 0);
void matmul_swiglu_backward_packed(bf16* dgate_up, bf16* out, const bf16* dy, const bf16* w_down, const bf16* gate_up,
                                   int64_t N, int64_t F, int64_t C, PackedScratch& packed, Workspace& ws,
                                   int64_t strips_per_pass = 0);

// With dlogits, one FP32 row of exponentials per thread in Workspace slot kCrossEntropyRowSlot.
constexpr size_t kCrossEntropyRowSlot = 14;  // (attention uses 1, embedding 12, decode 13)
template <class T> void cross_entropy(float* losses, T* dlogits, const float* logits, const int32_t* targets,
                                      const uint8_t* mask, int64_t N, int64_t V, float grad_scale, Workspace& ws);
// totals += the losses of the positions where mask[i], in optim_math's fixed lane order (Backend::accumulate_loss).
void accumulate_loss(LossTotals* totals, const float* losses, const uint8_t* mask, int64_t N);
// The loss head fused (see above): cross_entropy of logits = x w^T (x [N, C], w [V, C]).
void linear_cross_entropy_packed(float* losses, bf16* dlogits, const bf16* x, const bf16* w, const int32_t* targets,
                                 const uint8_t* mask, int64_t N, int64_t V, int64_t C, float grad_scale,
                                 PackedScratch& packed, Workspace& ws, int64_t strips_per_pass = 0);

template <class TO, class TI> void convert(TO* dst, const TI* src, int64_t n);

// Optimizer kernels (contracts: the Backend optimizer ops).
// T: weights, G: gradients (the same, or FP32 gradients with BF16 weights), S: optimizer states.
// SWAN reports the Newton-Schulz residual ||I - Z Y||_F / sqrt(k) of its final iterate (0 on the
// exact path) and whether a diverged iteration fell back to the exact path.
struct SwanReport {
  double residual = 0;     // of the final iterate; NaN when it diverged (fell_back)
  bool fell_back = false;
  int steps = 0;           // Newton-Schulz iterations applied
};
// SinkGD's column sums go through this many chunks of rows (about 64 rows each, at most 64): a
// function of m alone, so the result does not depend on the thread count. Its scratch: u (m), v (n),
// 2 x chunks x n partial sums, v and v^2 per thread, kSinkgdRowGroup FP32 rows of n per thread (the
// BF16 rows it widens at a time), and, where sinkgd_caches_rows says so, all of G widened (m x n FP32).
// `rows` forces either path for a BF16 G (tests: both give the same bits).
constexpr int64_t kSinkgdRowGroup = 4;
inline int64_t sinkgd_chunks(int64_t m) { return std::min<int64_t>(64, std::max<int64_t>(1, (m + 63) / 64)); }
bool sinkgd_caches_rows(int64_t m, int64_t n, int threads);
enum class SinkgdRows { kAuto, kCached, kStreamed };
template <class T, class G>
void sinkgd_update(T* w, const G* g, int64_t m, int64_t n, const SinkGDArgs& a, Workspace& ws,
                   SinkgdRows rows = SinkgdRows::kAuto);
// The Backend's sinkgd_update_many: the tensors for which sinkgd_runs_one_core says so run whole, one
// per core at a time (sinkgd_one_core_floats of scratch per thread in slot kSinkgdOneCoreSlot, the
// order in ws.ints); the others as sinkgd_update. The same bits as sinkgd_update on each tensor,
// whichever way a tensor goes (tests pass a small one_core_bytes to send some each way).
constexpr size_t kSinkgdOneCoreSlot = 25;  // (sinkgd_update uses 20-24)
// Three quarters of the larger of one core's L2 and its share of the L3 with `threads` cores.
int64_t sinkgd_one_core_bytes(int threads);
// A tensor runs on one core when its G takes at most one_core_bytes (0: sinkgd_one_core_bytes) and
// either fits three quarters of the core's L2 or is no more than a fair share (1 / threads) of the
// call's elements, `total` (a lone tensor past L2 is split over the cores rather than leave them idle).
bool sinkgd_runs_one_core(int64_t m, int64_t n, int64_t g_bytes, int64_t total, int threads, int64_t one_core_bytes = 0);
int64_t sinkgd_one_core_floats(int64_t m, int64_t n);
void sinkgd_update_many(const SinkGDTensor* tensors, int64_t count, const SinkGDArgs& args, Workspace& ws,
                        int64_t one_core_bytes = 0);
template <class T, class G> SwanReport swan_update(T* w, const G* g, int64_t m, int64_t n, const SwanArgs& a, OneDnnMatmul& gemm, Workspace& ws);
// One element-wise rule (its Step: kernels/common/elementwise_rules.h) over a tensor: nstates state
// arrays (the Step's count, or none where its rule keeps its state only sometimes); w, g and the
// states must not overlap (the loop is vectorised on that promise). elementwise.cpp
template <class Step, class T, class G, class S>
void elementwise_update(T* w, const G* g, S* const* states, int nstates, int64_t n, const RuleScalars& r, const WriteBack& wb);
template <class T> double sum_squares(const T* x, int64_t n);
template <class T> void scale(T* x, int64_t n, float factor);

}  // namespace multinorm::cpu
