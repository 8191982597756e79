// Error messages of the CUDA backend (both builds).
#include "check.h"

#include <map>
#include <mutex>
#include <utility>

#include "multinorm/error.h"

namespace multinorm::cuda {

void throw_cuda_error(const std::string& what, cudaError_t e) {
  throw Error("CUDA error: " + what + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

void throw_launch_error(const char* kernel, dim3 grid, dim3 block, size_t shared_bytes, const std::string& why) {
  throw Error(std::string("CUDA kernel ") + kernel + " (grid " + std::to_string(grid.x) + "x" + std::to_string(grid.y) + "x" + std::to_string(grid.z) +
              ", block " + std::to_string(block.x) + "x" + std::to_string(block.y) + "x" + std::to_string(block.z) + ", " +
              std::to_string(shared_bytes) + " B shared): " + why);
}

void allow_dynamic_shared(const char* name, const void* kernel, size_t bytes) {
  // The attribute belongs to the kernel in one device's context: a backend on a second GPU of the
  // process must set it again, so the cache is per (device, kernel).
  int device = 0;
  if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) throw_cuda_error(std::string("cudaGetDevice before launching ") + name, e);
  static std::mutex mu;
  static std::map<std::pair<int, const void*>, size_t> allowed;  // the attribute set so far
  std::lock_guard<std::mutex> lock(mu);
  size_t& current = allowed[{device, kernel}];
  if (bytes <= current) return;
  const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  if (e != cudaSuccess) {
    cudaGetLastError();  // not sticky: clear it
    throw Error(std::string("CUDA kernel ") + name + " needs " + std::to_string(bytes) +
                " B of dynamic shared memory, more than this device lets a block have (cudaFuncSetAttribute: " + cudaGetErrorName(e) + ")");
  }
  current = bytes;
}

void check_after_launch(const char* name, dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream) {
  cudaError_t e = cudaGetLastError();
#ifndef NDEBUG
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (e == cudaSuccess) e = cudaStreamIsCapturing(stream, &capture);
  if (e == cudaSuccess && capture == cudaStreamCaptureStatusNone) e = cudaStreamSynchronize(stream);  // not while capturing
#else
  (void)stream;
#endif
  if (e != cudaSuccess) throw_launch_error(name, grid, block, shared_bytes, std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e));
}

void throw_cublas_error(const std::string& what, cublasStatus_t s) {
  throw Error("cuBLASLt error: " + what + ": " + cublasLtGetStatusName(s) + " (" + cublasLtGetStatusString(s) + ")");
}

}  // namespace multinorm::cuda
