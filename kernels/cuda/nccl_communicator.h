// The CUDA backend's Communicator: NCCL over device memory, on a stream of its own (see
// nccl_communicator.cu). Built by nvcc against the real NCCL, and by g++ against the emulated one
// (kernels/cuda/emulation/nccl_emulation.cpp: MPI over the emulated device's host memory).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "cuda_compat.h"
#include "multinorm/communicator.h"

namespace multinorm::cuda {

// ncclGetUniqueId's bytes (rank 0 makes them; MPI carries them to the other ranks).
std::vector<uint8_t> nccl_unique_id();
class CudaQueue;
// A communicator of `size` ranks whose collectives start after the work issued on `compute`'s stream
// so far; its host waits are counted by `compute`.
std::unique_ptr<Communicator> make_nccl_communicator(const std::vector<uint8_t>& id, int rank, int size, double timeout_s,
                                                     CudaQueue& compute);

}  // namespace multinorm::cuda
