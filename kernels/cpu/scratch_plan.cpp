// The CPU backend's scratch after a training step, by the formulas its kernels allocate with
// (memory_estimate.h: cpu_backend_scratch_bytes). Here, with the kernels, so that nothing above the
// backend reaches into them: the memory estimate passes the shapes, this file knows the slots.
#include <algorithm>
#include <map>

#include "cpu_kernels.h"
#include "matmul_packed.h"
#include "multinorm/llama_model.h"
#include "multinorm/memory_estimate.h"

namespace multinorm {

int64_t cpu_backend_scratch_bytes(const ModelConfig& m, int64_t B, int64_t T, DType act, DType grad, OptimizerKind matrix_optimizer,
                                  const std::vector<MatrixShape>& matrices, bool swan_exact, int threads) {
  // Workspace slots hold the largest request made to each; the sum of the slots is the scratch.
  std::map<int, int64_t> slot;  // floats per slot (-1: the int32 buffer)
  auto need = [&](int s, int64_t floats) { slot[s] = std::max(slot[s], floats); };
  const int64_t C = m.hidden_size, D = m.head_dim(), BT = B * T;
  {  // kernels/cpu/attention.cpp: per thread, one head's operands and statistics and the strips
    const auto a = cpu::attention_scratch(T, D, cpu::attention_engine(act == DType::BF16) != cpu::AttentionEngine::Portable);
    need(cpu::AttentionScratch::kThread, std::max(a.forward_thread_floats(), a.backward_thread_floats()) * std::max(threads, 1));
  }
  need(0, (BT + 31) / 32 * C);            // kernels/cpu/rmsnorm.cpp: partial column sums per 32 rows
  need(-1, 2 * BT);                       // kernels/cpu/embedding.cpp: order and run starts (int32)
  need(12, 2 * C * std::max(threads, 1)); // ... and two FP32 rows per thread (a piece, the total)
  if (cpu::fuses_gemm_epilogues(act == DType::BF16)) {  // the fused GEMM epilogues' strips per thread
    const int64_t F = m.intermediate_size, V = m.vocab_size;
    auto strips = [&](int64_t N) { return cpu::row_strips_per_pass(N, C, threads); };  // every one has K = C
    need(cpu::kGemmStripSlot, std::max({cpu::gemm_strip_floats(V, strips(V)), cpu::gemm_strip_floats(2 * F, strips(2 * F)),
                                        cpu::swiglu_backward_strip_floats(F, strips(F))}) *
                                  std::max(threads, 1));
  } else {  // cross_entropy.cpp: a row of exponentials per thread
    need(cpu::kCrossEntropyRowSlot, m.vocab_size * std::max(threads, 1));
  }
  // The matrices, all in one sinkgd_update_many (a data-parallel rank that updates a share of them
  // passes its share, as this estimate's other terms assume one process).
  int64_t sinkgd_tensors = 0, sinkgd_elements = 0;
  for (const MatrixShape& mat : matrices) sinkgd_elements += mat.rows * mat.cols;
  for (const MatrixShape& mat : matrices) {
    const int64_t r = mat.rows, c = mat.cols, k = std::min(r, c);
    if (matrix_optimizer == OptimizerKind::SinkGD) {  // kernels/cpu/sinkgd.cpp, every matrix through sinkgd_update_many
      const int64_t t = std::max(threads, 1);
      ++sinkgd_tensors;
      if (cpu::sinkgd_runs_one_core(r, c, dtype_bytes(grad), sinkgd_elements, static_cast<int>(t))) {  // scratch per thread
        need(cpu::kSinkgdOneCoreSlot, t * cpu::sinkgd_one_core_floats(r, c));
      } else {  // row-split: u, v and v^2 per thread, partial column sums (two sets), a row group per
                // thread, and BF16 G's widened rows where they fit the cores' L2
        need(20, r), need(21, 2 * c * t), need(22, 2 * cpu::sinkgd_chunks(r) * c), need(23, cpu::kSinkgdRowGroup * c * t);
        if (grad == DType::BF16 && cpu::sinkgd_caches_rows(r, c, static_cast<int>(t))) need(24, r * c);
      }
    } else if (matrix_optimizer == OptimizerKind::Swan) {  // kernels/cpu/swan.cpp
      need(30, r * c);                    // X
      if (swan_exact) {
        need(37, 2 * k * k), need(38, 2 * r * c), need(39, 2 * (k * k + k)), need(40, 2 * k * k), need(41, 2 * r * c);
      } else {
        for (int s : {31, 32, 33, 34, 35}) need(s, k * k);  // A Y Z P T
        need(36, r * c);                  // U
      }
    }
  }
  need(-1, sinkgd_tensors);  // sinkgd_update_many's order of the tensors (int32)
  int64_t floats = 0;
  for (const auto& [s, n] : slot) floats += n;
  // kernels/cpu/matmul_packed.cpp: the packed BF16 GEMM holds the packed operands of the largest one.
  int64_t packed_elements = 0;
  if (act == DType::BF16 && cpu::packed_bf16_gemm_usable()) {
    int64_t a = 0, b = 0;
    for (const GemmShape& g : training_step_gemms(m, BT)) {
      const int64_t strips = g.row_strips ? cpu::row_strips_per_pass(g.N, g.K, threads) : 1;
      const cpu::PackedElements p = cpu::packed_gemm_elements(g.M, g.N, g.K, g.trans_a, threads, strips);
      a = std::max(a, p.a), b = std::max(b, p.b);
    }
    packed_elements = a + b;
  }
  return floats * 4 + packed_elements * 2;
}

}  // namespace multinorm
