#include "multinorm/data_parallel.h"

namespace multinorm {

GradientAllReduce::GradientAllReduce(LlamaModel& model, Comm& comm) : model_(model), comm_(comm) {
  if (comm_.size() == 1) return;
  if (model_.grad_dtype() != DType::F32) staging_ = model_.backend().allocate(model_.num_params() * 4);
  if (!model_.backend().host_memory()) host_.resize(static_cast<size_t>(model_.num_params()));
}

GradientAllReduce::~GradientAllReduce() {
  if (staging_) model_.backend().release(staging_);
}

// A host-memory backend's FP32 arena goes to MPI as it is; device memory crosses explicitly
// (to_host, sum over the ranks, to_device).
void GradientAllReduce::run() {
  if (comm_.size() == 1) return;
  const int64_t n = model_.num_params();
  Backend& be = model_.backend();
  const Buf fp32 = staging_ ? Buf{staging_, DType::F32} : model_.grads();
  if (staging_) be.convert(fp32, model_.grads(), n);
  if (be.host_memory()) {
    comm_.allreduce_sum(fp32.f32(), n);
  } else {
    be.to_host(host_.data(), fp32.ptr, n * 4);
    comm_.allreduce_sum(host_.data(), n);
    be.to_device(fp32.ptr, host_.data(), n * 4);
  }
  if (staging_) be.convert(model_.grads(), fp32, n);
}

}  // namespace multinorm
