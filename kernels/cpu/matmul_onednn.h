// GEMMs on the CPU through oneDNN's matmul primitive (brgemm: AVX512_BF16 for bf16 inputs with FP32
// accumulation, AVX-512 for fp32). One primitive per shape/layout/dtype, created on first use and
// cached, so a training step creates none after the first. Single BF16 GEMMs go to the packed GEMM
// instead where the CPU has AMX or AVX512_BF16 (matmul_packed.h).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>

#include "multinorm/backend.h"

namespace multinorm::cpu {

struct PackedScratch;

class OneDnnMatmul {
 public:
  OneDnnMatmul();
  ~OneDnnMatmul();
  // out[M,N] (+)= op(a)[M,K] op(b)[K,N]; see Backend::matmul.
  void run(Buf out, Buf a, Buf b, int64_t M, int64_t N, int64_t K, bool trans_a, bool trans_b, bool accumulate) {
    run_batched(out, a, b, 1, M, N, K, trans_a, trans_b, accumulate);
  }
  // `batch` independent GEMMs over consecutive matrices of each operand (strides M*K, K*N, M*N).
  void run_batched(Buf out, Buf a, Buf b, int64_t batch, int64_t M, int64_t N, int64_t K, bool trans_a, bool trans_b,
                   bool accumulate);
  size_t cached_primitives() const;
  int64_t scratch_bytes() const;  // the packed GEMM's operands (oneDNN's own scratch is not counted)
  PackedScratch& packed_scratch();  // the packed GEMM's buffers, for a fused op that drives its blocks

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace multinorm::cpu
