// Data parallelism: every rank holds the whole model and optimizer, computes the gradient of its own
// micro-batches (the loader gives each rank a disjoint slice of every global step), and the
// gradients are summed over the ranks before the optimizer step, which then runs identically on
// every rank. Over MPI on CPUs; the same seam takes NCCL on GPUs.
#pragma once
#include <vector>

#include "multinorm/comm.h"
#include "multinorm/llama_model.h"

namespace multinorm {

// Sums the gradient arena over the ranks, in place. FP32 gradients are reduced directly; BF16 ones
// through one FP32 staging buffer allocated once (summed in FP32, rounded once, to nearest even).
// Device-memory backends cross to the host explicitly for MPI (NCCL will reduce on the device).
class GradientAllReduce {
 public:
  GradientAllReduce(LlamaModel& model, Comm& comm);
  ~GradientAllReduce();
  GradientAllReduce(const GradientAllReduce&) = delete;
  GradientAllReduce& operator=(const GradientAllReduce&) = delete;
  void run();

 private:
  LlamaModel& model_;
  Comm& comm_;
  void* staging_ = nullptr;  // FP32, for BF16 gradients with more than one rank
  std::vector<float> host_;  // the host copy MPI reduces, for device-memory backends
};

}  // namespace multinorm
