// Checking every CUDA runtime and cuBLASLt call: a failure throws multinorm::Error naming the call,
// what the backend was doing (op and shapes) and the error.
#pragma once
#include <cublasLt.h>

#include <string>

#include "cuda_compat.h"

namespace multinorm::cuda {

[[noreturn]] void throw_cublas_error(const std::string& what, cublasStatus_t s);

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
