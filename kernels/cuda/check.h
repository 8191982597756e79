// Checking every CUDA runtime and cuBLASLt call: a failure throws multinorm::Error naming the call,
// what the backend was doing (op and shapes) and the error.
#pragma once
#include <cublasLt.h>

#include <string>

#include "cuda_compat.h"

namespace multinorm::cuda {

[[noreturn]] void throw_cublas_error(const std::string& what, cublasStatus_t s);
// The host waits for everything queued on `stream` (checked; `what` names the wait in an error).
// Every such wait of the backend goes through here and is counted: host_waits() is what
// Backend::host_synchronisations() reports, and the tests bound it per micro-batch and per update.
// (Debug builds' synchronisation after each launch, a diagnostic mode, is not counted.)
// A wait also delivers the copies queue_copy_to_host() queued on that stream.
void wait_for_stream(cudaStream_t stream, const std::string& what);
int64_t host_waits();
// A device-to-host copy queued on `stream` without waiting: the bytes go by cudaMemcpyAsync into
// pinned staging (pageable memory would make the copy synchronous) and reach `host_dst` when the
// host next waits for the stream (wait_for_stream). host_dst must stay valid until then; until
// then it keeps its old bytes. The staging grows on first use and is reused once delivered.
void queue_copy_to_host(void* host_dst, const void* device_src, int64_t bytes, cudaStream_t stream);
// Copies queued on `stream` and not yet delivered.
int64_t queued_copies(cudaStream_t stream);
// For a stream about to be destroyed: waits for it (not counted, errors ignored) and drops its
// undelivered copies, whose destinations may be gone.
void discard_queued_copies(cudaStream_t stream);

}  // namespace multinorm::cuda

#define MN_CUDA_CHECK(call, what)                                                                  \
  do {                                                                                             \
    const cudaError_t mn_e_ = (call);                                                              \
    if (mn_e_ != cudaSuccess) ::multinorm::cuda::throw_cuda_error(std::string(#call) + " in " + (what), mn_e_); \
  } while (0)
#define MN_CUBLAS_CHECK(call, what)                                                                \
  do {                                                                                             \
    const cublasStatus_t mn_s_ = (call);                                                           \
    if (mn_s_ != CUBLAS_STATUS_SUCCESS) ::multinorm::cuda::throw_cublas_error(std::string(#call) + " in " + (what), mn_s_); \
  } while (0)
