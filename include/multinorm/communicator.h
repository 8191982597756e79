// The communicator seam: the collectives data parallelism needs over buffers of the backend's
// memory. Two implementations: MPI over host memory (src/parallel/mpi_communicator.cpp, the CPU
// backend) and NCCL over device memory (kernels/cuda/nccl_communicator.cu, the CUDA backend; its
// unique id is bootstrapped over MPI). In the emulated CUDA build the NCCL calls are served by MPI
// over host memory (kernels/cuda/emulation/nccl_emulation.cpp), so the NCCL code runs in the tests.
//
// Every call only starts a collective and returns; every rank starts the same collectives in the
// same order (the trainer's loop is the same on all ranks). A buffer handed to a collective is not
// touched until wait_all() returns. wait_all() never waits forever: past the timeout it throws an
// Error naming the pending collective, so a dead or stalled rank ends the run instead of hanging it.
#pragma once
#include <cstdint>
#include <string>

#include "multinorm/dtype.h"

namespace multinorm {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual std::string name() const = 0;  // "MPI", "NCCL", "NCCL (emulated over MPI)"
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // In place: buf[n] <- sum over the ranks (FP32 or BF16; BF16 sums are rounded to nearest even).
  virtual void all_reduce_sum(void* buf, int64_t n, DType t, const char* what) = 0;
  // In place on `root`: buf[n] <- sum over the ranks; the other ranks' buf is left as it was.
  virtual void reduce_sum(void* buf, int64_t n, DType t, int root, const char* what) = 0;
  // recv[n] <- the sum over the ranks of send[rank * n .. (rank + 1) * n) (send holds size * n).
  virtual void reduce_scatter_sum(const void* send, void* recv, int64_t n, DType t, const char* what) = 0;
  // recv[size * n] <- the ranks' send[n], in rank order (send may be recv + rank * n).
  virtual void all_gather(const void* send, void* recv, int64_t n, DType t, const char* what) = 0;
  // buf[n] <- root's buf[n].
  virtual void broadcast(void* buf, int64_t n, DType t, int root, const char* what) = 0;
  // Advances the started collectives without blocking (MPI needs calls into the library to move a
  // non-blocking collective on; NCCL progresses on its own). True when none is pending.
  virtual bool progress() = 0;
  // Completes every started collective, or throws after timeout_s naming the oldest pending one.
  virtual void wait_all() = 0;
  // A mark after the collectives started so far (valid until the next wait_all), and an order on
  // it: after_mark(m) makes the backend's later work run after every collective started before m.
  // A device communicator makes the compute stream wait for an event (the host does not wait); MPI,
  // whose collectives the host drives, completes those requests (with the timeout of wait_all).
  virtual int64_t mark() = 0;
  virtual void after_mark(int64_t mark) = 0;
};

}  // namespace multinorm
