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
  // FP32 is the mixed-precision path). Leading dimensions are the row widths: any width works
  // (5461 included): cuBLASLt picks an algorithm for the alignment it is given.
  void run(void* out, cudaDataType out_type, const void* a, const void* b, cudaDataType in_type, int64_t M, int64_t N, int64_t K, bool trans_a,
           bool trans_b, bool accumulate, cudaStream_t stream);

  static constexpr size_t kWorkspaceBytes = cuda_scratch::kGemmWorkspaceBytes;
  size_t workspace_bytes() const { return kWorkspaceBytes; }

 private:
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  // Shape, transposes, types and the operands' alignments (out, a, b): cuBLASLt's algorithm is
  // chosen for the alignments it is told and may rely on them, so a less aligned pointer gets a plan
  // of its own.
  using Key = std::tuple<int64_t, int64_t, int64_t, bool, bool, int, int, uint32_t, uint32_t, uint32_t>;
  Plan& plan(const Key& key);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  std::map<Key, Plan> plans_;
};

}  // namespace multinorm::cuda
