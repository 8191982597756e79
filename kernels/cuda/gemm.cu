// Row-major GEMM on column-major cuBLASLt: a row-major [R, C] matrix is the column-major [C, R]
// one, so out = op(a) op(b) (row-major) is out^T = op(b)^T op(a)^T (column-major): cuBLASLt computes
// D[N, M] = op_b(B) op_a(A) with A := b and B := a, each operand's layout as stored.
#include "gemm.h"

#include <algorithm>
#include <string>
#include <utility>

#include "check.h"
#include "profiler.h"

namespace multinorm::cuda {

namespace {
// The largest power of two up to 256 that divides the address (cuBLASLt's alignment preferences).
uint32_t alignment_of(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  return a == 0 ? 256u : static_cast<uint32_t>(std::min<uintptr_t>(256, a & (~a + 1)));
}
// Matrix i of a batched FP32 operand starts stride floats after matrix i - 1: its alignment is the
// base's and the stride's, whichever is smaller (the base's alone for stride 0).
uint32_t batch_alignment_of(const void* p, int64_t stride) {
  return stride ? std::min(alignment_of(p), alignment_of(reinterpret_cast<const void*>(stride * 4))) : alignment_of(p);
}
}  // namespace

LtGemm::LtGemm() {
  MN_CUBLAS_CHECK(cublasLtCreate(&handle_), "creating the cuBLASLt handle");
  MN_CUDA_CHECK(cudaMalloc(&workspace_, kWorkspaceBytes), "allocating the cuBLASLt workspace (" + std::to_string(kWorkspaceBytes) + " bytes)");
}

LtGemm::~LtGemm() {
  for (auto& [key, p] : plans_) {
    cublasLtMatrixLayoutDestroy(p.a);
    cublasLtMatrixLayoutDestroy(p.b);
    cublasLtMatrixLayoutDestroy(p.c);
    cublasLtMatmulDescDestroy(p.desc);
  }
  cudaFree(workspace_);
  cublasLtDestroy(handle_);
}

LtGemm::Plan& LtGemm::plan(const Key& key) {
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second;
  const auto [M, N, K, ta, tb, in, out, align_out, align_a, align_b, ld_out, ld_a, ld_b, batch, stride_out, stride_a, stride_b, tf32] = key;
  const std::string what = "matmul M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K) + (ta ? " a^T" : "") +
                           (tb ? " b^T" : "") + " (" + (in == CUDA_R_16BF ? "bf16" : "fp32") + " -> " + (out == CUDA_R_16BF ? "bf16" : "fp32") +
                           ", operands aligned to " + std::to_string(align_out) + "/" + std::to_string(align_a) + "/" + std::to_string(align_b) +
                           " B, row strides " + std::to_string(ld_out) + "/" + std::to_string(ld_a) + "/" + std::to_string(ld_b) + ")" +
                           (batch > 1 ? " x " + std::to_string(batch) + " (strides " + std::to_string(stride_out) + "/" + std::to_string(stride_a) +
                                            "/" + std::to_string(stride_b) + ")"
                                      : "") +
                           (tf32 ? ", TF32 compute" : "");
  Plan p;
  MN_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUDA_R_32F), what);
  // Column-major roles: first operand is b (stored row-major [K,N] or, transposed, [N,K]).
  const int32_t op_first = tb ? CUBLAS_OP_T : CUBLAS_OP_N, op_second = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  MN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof(op_first)), what);
  MN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_second, sizeof(op_second)), what);
  const auto in_t = static_cast<cudaDataType>(in), out_t = static_cast<cudaDataType>(out);
  // b row-major [K,N] = column-major N x K (rows of N); transposed b row-major [N,K] = column-major K x N
  MN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, in_t, tb ? K : N, tb ? N : K, ld_b), what);
  // a row-major [M,K] = column-major K x M (rows of K); transposed a row-major [K,M] = column-major M x K
  MN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, in_t, ta ? M : K, ta ? K : M, ld_a), what);
  MN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, out_t, N, M, ld_out), what);
  if (batch > 1) {  // (cuBLASLt's first operand is b, its second a)
    const int32_t count = static_cast<int32_t>(batch);
    const std::pair<cublasLtMatrixLayout_t, int64_t> strided[3] = {{p.a, stride_b}, {p.b, stride_a}, {p.c, stride_out}};
    for (const auto& [l, stride] : strided) {
      MN_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)), what);
      MN_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)), what);
    }
  }
  cublasLtMatmulPreference_t pref;
  MN_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref), what);
  const uint64_t ws = kWorkspaceBytes;
  MN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)), what);
  // cuBLASLt's first operand is b, its second a (the column-major view); D is `out`, C `out` or the
  // residual addend (one layout, one alignment preference).
  const uint32_t alignments[4] = {align_b, align_a, align_out, align_out};
  const cublasLtMatmulPreferenceAttributes_t attrs[4] = {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                          CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  for (int i = 0; i < 4; ++i)
    MN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attrs[i], &alignments[i], sizeof(alignments[i])), what);
  // Split-K partial sums are added in FP32 (the compute type), in the workspace: never in the output's
  // BF16 (OUTPUT_TYPE) nor in the output buffer itself (INPLACE). An H100 picked a BF16 reduction for
  // a 5 x 6 x 5461 product and missed the FP32-accumulation bound by 1.6x (gpu_check, 2026-11-27).
  const uint32_t reductions = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  MN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reductions, sizeof(reductions)), what);
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(handle_, p.desc, p.a, p.b, p.c, p.c, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  MN_CUBLAS_CHECK(s, what);
  if (found == 0) throw_cublas_error("cublasLtMatmulAlgoGetHeuristic found no algorithm for " + what, CUBLAS_STATUS_NOT_SUPPORTED);
  p.algo = result.algo;
  return plans_.emplace(key, p).first->second;
}

void LtGemm::run(void* out, int64_t ld_out, cudaDataType out_type, const void* a, int64_t ld_a, const void* b, int64_t ld_b, cudaDataType in_type,
                 int64_t M, int64_t N, int64_t K, bool ta, bool tb, bool accumulate, cudaStream_t stream, const void* addend) {
  if (M == 0 || N == 0) return;
  if (addend && (!accumulate || K == 0)) throw_cublas_error("a matmul's addend needs accumulate and K > 0", CUBLAS_STATUS_INVALID_VALUE);
  if (K == 0) {  // an empty sum: out = 0, or unchanged when accumulating (M rows of out's own stride: a padded row's padding is zeros anyway)
    if (!accumulate) {
      MN_CUDA_CHECK(cudaMemsetAsync(out, 0, M * ld_out * (out_type == CUDA_R_16BF ? 2 : 4), stream), "matmul with K = 0");
    }
    return;
  }
  // C and D share a layout and an alignment preference: the addend's, where it is less aligned than out.
  const uint32_t align_out = addend ? std::min(alignment_of(out), alignment_of(addend)) : alignment_of(out);
  const Plan& p = plan(Key{M, N, K, ta, tb, static_cast<int>(in_type), static_cast<int>(out_type), align_out, alignment_of(a), alignment_of(b), ld_out,
                           ld_a, ld_b, int64_t{1}, int64_t{0}, int64_t{0}, int64_t{0}, false});
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  const bool timed = profiler::g_on;
  if (timed) profiler::begin(in_type == CUDA_R_16BF ? "gemm bf16 (cuBLASLt)" : "gemm fp32 (cuBLASLt)", stream);
  MN_CUBLAS_CHECK(cublasLtMatmul(handle_, p.desc, &alpha, b, p.a, a, p.b, &beta, addend ? addend : out, p.c, out, p.c, &p.algo, workspace_,
                                 kWorkspaceBytes, stream),
                  "matmul M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K));
  if (timed) profiler::end(stream);
}

void LtGemm::run_batched(float* out, int64_t ld_out, int64_t stride_out, const float* a, int64_t ld_a, int64_t stride_a, const float* b, int64_t ld_b,
                         int64_t stride_b, int64_t M, int64_t N, int64_t K, bool ta, bool tb, int64_t batch, cudaStream_t stream) {
  if (batch == 1) return run(out, ld_out, CUDA_R_32F, a, ld_a, b, ld_b, CUDA_R_32F, M, N, K, ta, tb, false, stream);
  if (M == 0 || N == 0 || K == 0 || batch == 0) throw_cublas_error("a batched matmul with an empty dimension", CUBLAS_STATUS_INVALID_VALUE);
  const Plan& p = plan(Key{M, N, K, ta, tb, static_cast<int>(CUDA_R_32F), static_cast<int>(CUDA_R_32F), batch_alignment_of(out, stride_out),
                           batch_alignment_of(a, stride_a), batch_alignment_of(b, stride_b), ld_out, ld_a, ld_b, batch, stride_out, stride_a,
                           stride_b, false});
  const float alpha = 1.0f, beta = 0.0f;
  const bool timed = profiler::g_on;
  if (timed) profiler::begin("gemm fp32 batched (cuBLASLt)", stream);
  MN_CUBLAS_CHECK(cublasLtMatmul(handle_, p.desc, &alpha, b, p.a, a, p.b, &beta, out, p.c, out, p.c, &p.algo, workspace_, kWorkspaceBytes, stream),
                  "batched matmul M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K) + " x " + std::to_string(batch));
  if (timed) profiler::end(stream);
}

void LtGemm::run_batched_split_tf32(float* out, const float* a_hi, const float* a_lo, const float* b_hi, const float* b_lo, int64_t M, int64_t N,
                                    int64_t K, int64_t batch, int64_t stride, cudaStream_t stream) {
  if (M == 0 || N == 0 || K == 0 || batch == 0) throw_cublas_error("a batched matmul with an empty dimension", CUBLAS_STATUS_INVALID_VALUE);
  const int64_t s = batch > 1 ? stride : 0;
  auto aligned = [s](const void* p) { return batch_alignment_of(p, s); };
  const bool timed = profiler::g_on;
  const float alpha = 1.0f;
  auto product = [&](const float* a, const float* b, float beta) {
    const Plan& p = plan(Key{M, N, K, false, false, static_cast<int>(CUDA_R_32F), static_cast<int>(CUDA_R_32F), aligned(out), aligned(a), aligned(b), N, K,
                             N, batch, s, s, s, true});
    if (timed) profiler::begin("gemm tf32 batched (cuBLASLt)", stream);
    MN_CUBLAS_CHECK(cublasLtMatmul(handle_, p.desc, &alpha, b, p.a, a, p.b, &beta, out, p.c, out, p.c, &p.algo, workspace_, kWorkspaceBytes, stream),
                    "split TF32 matmul M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K) + " x " +
                        std::to_string(batch));
    if (timed) profiler::end(stream);
  };
  product(a_lo, b_hi, 0.0f);
  product(a_hi, b_lo, 1.0f);
  product(a_hi, b_hi, 1.0f);
}

}  // namespace multinorm::cuda
