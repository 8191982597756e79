// One update's device work, as the trainer queues it, apart from the loop that decides what comes
// next: an update's micro-batches with their gradient scales (the last one arming data
// parallelism's overlapped reduction), the rest of the reduction, the optimizer step with the spike
// test, and later the read of the step's statistics. None of these waits for the device but the
// last, so the next update's micro-batches can be queued before the previous step is read (the
// trainer's loop, trainer.cpp). The trainer and `multinorm doctor` time the same pipeline.
#pragma once
#include <cstdint>
#include <vector>

#include "multinorm/comm.h"
#include "multinorm/config_choices.h"
#include "multinorm/data_parallel.h"
#include "multinorm/llama_model.h"
#include "multinorm/optimizer.h"

namespace multinorm {

// Where one update's time went, in seconds, as it is queued and as it is logged. Forward and
// backward are the host time of the last micro-batch's launches (a replayed CUDA graph: all in
// forward_s); comm_exposed_s is the part of the wait for the gradient reduction that the backward
// pass did not cover.
struct UpdateTimes {
  double data_wait_s = 0, forward_s = 0, backward_s = 0, compute_s = 0, optimizer_s = 0, comm_wait_s = 0, comm_exposed_s = 0;
};

class UpdatePipeline {
 public:
  // accum micro-batches an update on each of the comm's ranks; `sync` reduces the gradients over them.
  UpdatePipeline(LlamaModel& model, Optimizer& optimizer, GradientSync& sync, Comm& comm, LossNormalization normalization,
                 int64_t accum);

  // Zeroes the gradients and queues the update's micro-batches (this rank's, with no host wait).
  // total_count: the counted targets of the whole global step, over every rank (token mean divides
  // by it). A micro-batch without a counted target is passed over. Sets times->forward_s,
  // backward_s and compute_s.
  void queue_micro_batches(const std::vector<MicroBatch>& batches, int64_t total_count, UpdateTimes* times);
  // The rest of the gradient reduction waited for, then the optimizer step queued behind the
  // micro-batches (Optimizer::queue_step). Sets times->comm_wait_s, comm_exposed_s and optimizer_s.
  void queue_step(int64_t update, int64_t applied, const SpikeTest& spike, UpdateTimes* times);
  // The queued step's statistics: a wait for it, not a drain.
  StepStats wait_for_step() { return optimizer_.wait_for_step(); }
  // An update queued and not stepped (a rollback came): its reduction completes (every rank started
  // it); the next queue_micro_batches drops its gradients.
  void discard();

 private:
  // The reduction's rest: its wait, and the part of it no slower rank explains.
  void finish_reduction(UpdateTimes* times);

  LlamaModel& model_;
  Optimizer& optimizer_;
  GradientSync& sync_;
  Comm& comm_;
  LossNormalization normalization_;
  int64_t accum_;
  double backward_end_ = 0;  // wall clock when this rank's last backward pass was queued
};

}  // namespace multinorm
