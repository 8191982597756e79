// GEMMs of the CUDA backend through cuBLASLt (FP32 compute; BF16 or FP32 inputs; BF16 or FP32
// output), with one workspace allocated once and the matmul descriptors + heuristic's algorithm
// cached per shape and operand alignment, so the hot path does no allocation and no heuristic query.
#pragma once
#include <cublasLt.h>

#include <cstdint>
#include <map>
#include <tuple>

#include "cuda_compat.h"
#include "multinorm/cuda_scratch.h"

namespace multinorm::cuda {

class LtGemm {
 public:
  LtGemm();
  ~LtGemm();
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  // Row-major out[M,N] = op(a)[M,K] op(b)[K,N] (+ out when accumulate); a transposed operand is
  // stored [K,M] (a) or [N,K] (b). Inputs share `in_type`; `out_type` may differ (BF16 x BF16 ->
  // FP32 is the mixed-precision path). ld_*: each operand's row stride in elements, at least its
  // row width: any stride works, but cuBLASLt is fast only where rows and bases are 16-byte aligned
  // (the backend stages the others: cuda_scratch::gemm_staging). With `addend` (and accumulate), out =
  // addend + op(a) op(b): cuBLASLt's C operand, with out's type and row stride (the plan takes the
  // lesser of their alignments).
  void run(void* out, int64_t ld_out, cudaDataType out_type, const void* a, int64_t ld_a, const void* b, int64_t ld_b, cudaDataType in_type,
           int64_t M, int64_t N, int64_t K, bool trans_a, bool trans_b, bool accumulate, cudaStream_t stream, const void* addend = nullptr);
  // `batch` FP32 products as run() takes one, matrix i of each operand stride_* elements after
  // matrix i - 1 (one strided-batched cuBLASLt call: SWAN's Gram matrices, Newton-Schulz steps and U).
  void run_batched(float* out, int64_t ld_out, int64_t stride_out, const float* a, int64_t ld_a, int64_t stride_a, const float* b, int64_t ld_b,
                   int64_t stride_b, int64_t M, int64_t N, int64_t K, bool trans_a, bool trans_b, int64_t batch, cudaStream_t stream);
  // Dense matrices, one stride for every operand (SWAN's k x k Newton-Schulz products).
  void run_batched(float* out, const float* a, const float* b, int64_t M, int64_t N, int64_t K, int64_t batch, int64_t stride, cudaStream_t stream) {
    run_batched(out, N, stride, a, K, stride, b, N, stride, M, N, K, false, false, batch, stream);
  }
  // Split TF32 (SWAN's Newton-Schulz products at large k): out = a b for `batch` dense products,
  // each operand given as its halves (optim_math::split_tf32: x = hi + lo, both exactly TF32), as
  // three TF32 tensor-core products summed in FP32, the small ones first: lo_a hi_b + hi_a lo_b +
  // hi_a hi_b (lo lo, 2^-22 of the product, left out). ~FP32 accuracy at ~3/7 of an FP32 product's
  // arithmetic time on an H100 (3/8 on an A100); out is written once and read and written twice.
  void run_batched_split_tf32(float* out, const float* a_hi, const float* a_lo, const float* b_hi, const float* b_lo, int64_t M, int64_t N, int64_t K,
                              int64_t batch, int64_t stride, cudaStream_t stream);
  // Dense rows (each stride its row width).
  void run(void* out, cudaDataType out_type, const void* a, const void* b, cudaDataType in_type, int64_t M, int64_t N, int64_t K, bool trans_a,
           bool trans_b, bool accumulate, cudaStream_t stream) {
    run(out, N, out_type, a, trans_a ? M : K, b, trans_b ? K : N, in_type, M, N, K, trans_a, trans_b, accumulate, stream);
  }

  static constexpr size_t kWorkspaceBytes = cuda_scratch::kGemmWorkspaceBytes;
  size_t workspace_bytes() const { return kWorkspaceBytes; }

 private:
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  // Shape, transposes, types, the operands' alignments (out, a, b) and row strides (out, a, b):
  // cuBLASLt's algorithm is chosen for the alignments it is told and may rely on them, so a less
  // aligned pointer gets a plan of its own.
  // A batched plan adds its batch count and strides (out, a, b) (1 and 0 otherwise); last, whether
  // its compute type is TF32 (CUBLAS_COMPUTE_32F_FAST_TF32) rather than FP32.
  using Key = std::tuple<int64_t, int64_t, int64_t, bool, bool, int, int, uint32_t, uint32_t, uint32_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                         int64_t, int64_t, bool>;
  Plan& plan(const Key& key);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  std::map<Key, Plan> plans_;
};

}  // namespace multinorm::cuda
