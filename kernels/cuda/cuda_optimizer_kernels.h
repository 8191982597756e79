// The CUDA backend's optimizer kernels (optimizer_kernels.h): every op queued on the backend's
// stream, never a host wait but sum_squares' read; multi-tensor launches' descriptor tables through
// the backend's DescriptorCache; SWAN's products on its cuBLASLt. The kernels: sinkgd.cu, swan.cu,
// elementwise.cu (Adam and SGD), convert.cu (the sums of squares, the update's statistics, clipping).
#pragma once
#include <memory>
#include <vector>

#include "cuda_queue.h"
#include "device_buffers.h"
#include "gemm.h"
#include "kernels.h"
#include "multinorm/optimizer_kernels.h"

namespace multinorm::cuda {

class CudaOptimizerKernels final : public OptimizerKernels {
 public:
  CudaOptimizerKernels(CudaQueue& q, LtGemm& gemm, DescriptorCache& descriptors);
  // Device bytes of its scratch (the reductions' partials, SinkGD's and SWAN's work space).
  int64_t scratch_bytes() const { return static_cast<int64_t>(reduce_scratch_->bytes() + opt_scratch_->bytes() + padded_scratch_->bytes()); }

  double sum_squares(Buf x, int64_t n) override;
  void sum_squares_many(const Buf* xs, const int64_t* ns, int64_t count, double* out) override;
  void update_statistics(UpdateScalars* s, const LossTotals* loss, const double* squares, int64_t count, double grad_clip) override;
  void clip_gradients(Buf x, int64_t n, const UpdateScalars* s) override;
  void scale(Buf x, int64_t n, float factor) override;
  void sinkgd_update(Buf w, Buf g, int64_t m, int64_t n, const SinkGDArgs& a) override;
  void sinkgd_update_many(const SinkGDTensor* tensors, int64_t count, const SinkGDArgs& a) override;
  void swan_update_many(const SwanTensor* tensors, int64_t count, const SwanArgs& a) override;
  void elementwise_update_many(ElementwiseKind kind, const ElementwiseTensor* tensors, int64_t count, const ElementwiseArgs& a) override;

 private:
  void* scratch(std::unique_ptr<Scratch>& s, size_t bytes, const char* what) { return s->get(bytes, what); }
  // A multi-tensor launch's descriptor table on the device (uploaded once: DescriptorCache).
  const void* descriptors(const void* table, size_t bytes, const char* what) { return descriptors_.get(table, bytes, what); }
  void elementwise_padded(ElementwiseKind kind, const ElementwiseTensor& t, const ElementwiseArgs& a);

  CudaQueue* q_;
  LtGemm* gemm_;
  DescriptorCache& descriptors_;
  std::unique_ptr<Scratch> reduce_scratch_, opt_scratch_, padded_scratch_;
  std::unique_ptr<SwanStaging> swan_staging_;
  std::vector<ElementwiseManyItem> many_items_;
  std::vector<SinkgdManyItem> sinkgd_items_;
  std::vector<SumSquaresItem> sum_items_;
};

}  // namespace multinorm::cuda
