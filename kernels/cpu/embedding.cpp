// Token embedding. Forward: out[i, :] = wte[tokens[i], :]. Backward: dwte[v, :] += sum of dout rows
// whose token is v. Rows are grouped by token (sorted, stable) and summed in FP32, so each dwte row
// is rounded once and the result does not depend on the thread count.
#include <algorithm>
#include <numeric>

#include "../common/op_math.h"
#include "cpu_kernels.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace multinorm::cpu {

namespace {
constexpr size_t kEmbeddingAccumulatorSlot = 12;  // Workspace slot (attention uses 1)
}  // namespace

template <class T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte, int64_t BT, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < BT; ++i) std::copy(wte + tokens[i] * C, wte + (tokens[i] + 1) * C, out + i * C);
}

template <class T, class G>
void embedding_backward(G* dwte, const T* dout, const int32_t* tokens, int64_t BT, int64_t C, Workspace& ws) {
  int32_t* order = ws.ints(2 * BT);
  int32_t* run_start = order + BT;
  std::iota(order, order + BT, 0);
  std::stable_sort(order, order + BT, [&](int32_t a, int32_t b) { return tokens[a] < tokens[b]; });
  int64_t runs = 0;
  for (int64_t i = 0; i < BT; ++i)
    if (i == 0 || tokens[order[i]] != tokens[order[i - 1]]) run_start[runs++] = static_cast<int32_t>(i);
  // One FP32 accumulator row per thread of the team below: the team is created with exactly
  // `threads` threads, so thread ids index the rows without sharing (any thread count).
  int threads = 1;
#ifdef _OPENMP
  threads = omp_get_max_threads();
#endif
  float* acc_all = ws.floats(static_cast<size_t>(2 * C) * threads, kEmbeddingAccumulatorSlot);
#pragma omp parallel num_threads(threads)
  {
    float* piece = acc_all;  // the current piece's sum, then the run's total (op_math's order)
#ifdef _OPENMP
    piece += static_cast<size_t>(omp_get_thread_num()) * 2 * C;
#endif
    float* total = piece + C;
#pragma omp for schedule(dynamic, 16)
    for (int64_t r = 0; r < runs; ++r) {
      const int64_t begin = run_start[r], end = r + 1 < runs ? run_start[r + 1] : BT;
      std::fill(piece, piece + C, 0.0f);
      bool have_total = false;
      for (int64_t i = begin; i < end; ++i) {
        if (i > begin && i % op_math::kEmbeddingSumChunk == 0) {  // a piece ends: into the total
          for (int64_t c = 0; c < C; ++c) total[c] = have_total ? total[c] + piece[c] : piece[c];
          have_total = true;
          std::fill(piece, piece + C, 0.0f);
        }
        const T* row = dout + static_cast<int64_t>(order[i]) * C;
        for (int64_t c = 0; c < C; ++c) piece[c] += to_f32(row[c]);
      }
      G* drow = dwte + static_cast<int64_t>(tokens[order[begin]]) * C;
      for (int64_t c = 0; c < C; ++c) drow[c] = from_f32<G>(to_f32(drow[c]) + (have_total ? total[c] + piece[c] : piece[c]));
    }
  }
}

template void embedding_forward<float>(float*, const int32_t*, const float*, int64_t, int64_t);
template void embedding_forward<bf16>(bf16*, const int32_t*, const bf16*, int64_t, int64_t);
// (activation gradient, weight gradient): FP32/FP32, BF16/BF16, BF16 into an FP32 gradient arena.
template void embedding_backward<float, float>(float*, const float*, const int32_t*, int64_t, int64_t, Workspace&);
template void embedding_backward<bf16, bf16>(bf16*, const bf16*, const int32_t*, int64_t, int64_t, Workspace&);
template void embedding_backward<bf16, float>(float*, const bf16*, const int32_t*, int64_t, int64_t, Workspace&);

}  // namespace multinorm::cpu
