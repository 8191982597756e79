#include "multinorm/data_parallel.h"

namespace multinorm {

GradientAllReduce::GradientAllReduce(LlamaModel& model, Comm& comm) : model_(model), comm_(comm) {
  if (comm_.size() > 1 && model_.grad_dtype() != DType::F32) staging_ = model_.backend().allocate(model_.num_params() * 4);
}

GradientAllReduce::~GradientAllReduce() {
  if (staging_) model_.backend().release(staging_);
}

// The CPU backend's buffers are host memory, which MPI reads and writes directly.
void GradientAllReduce::run() {
  if (comm_.size() == 1) return;
  const int64_t n = model_.num_params();
  Backend& be = model_.backend();
  if (!staging_) {
    comm_.allreduce_sum(static_cast<float*>(model_.grads().ptr), n);
    return;
  }
  const Buf fp32{staging_, DType::F32};
  be.convert(fp32, model_.grads(), n);
  comm_.allreduce_sum(static_cast<float*>(staging_), n);
  be.convert(model_.grads(), fp32, n);
}

}  // namespace multinorm
