// The CPU backend's optimizer kernels (optimizer_kernels.h): host memory, each op dispatched on its
// dtypes to the templated kernel of kernels/cpu/ (sinkgd.cpp, swan.cpp, elementwise.cpp, sum_squares.cpp), done when it
// returns. The update's scalars are read in host memory.
#pragma once
#include "cpu_kernels.h"
#include "matmul_onednn.h"
#include "multinorm/optimizer_kernels.h"

namespace multinorm::cpu {

class CpuOptimizerKernels final : public OptimizerKernels {
 public:
  // SWAN's products run on the backend's GEMM engine; scratch comes from its workspace.
  CpuOptimizerKernels(OneDnnMatmul& gemm, Workspace& ws) : gemm_(gemm), ws_(ws) {}

  double sum_squares(Buf x, int64_t n) override;
  void sum_squares_many(const Buf* xs, const int64_t* ns, int64_t count, double* out) override;
  void scale(Buf x, int64_t n, float factor) override;
  void update_statistics(UpdateScalars* s, const LossTotals* loss, const double* squares, int64_t count, double grad_clip) override;
  void clip_gradients(Buf x, int64_t n, const UpdateScalars* s) override;
  void sinkgd_update(Buf w, Buf g, int64_t m, int64_t n, const SinkGDArgs& args) override;
  void sinkgd_update_many(const SinkGDTensor* tensors, int64_t count, const SinkGDArgs& args) override;
  void swan_update_many(const SwanTensor* tensors, int64_t count, const SwanArgs& args) override;
  void elementwise_update_many(ElementwiseKind kind, const ElementwiseTensor* tensors, int64_t count, const ElementwiseArgs& args) override;

 private:
  OneDnnMatmul& gemm_;
  Workspace& ws_;
};

}  // namespace multinorm::cpu
