// Error messages of the CUDA backend (both builds).
#include "check.h"

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

void throw_cublas_error(const std::string& what, cublasStatus_t s) {
  throw Error("cuBLASLt error: " + what + ": " + cublasLtGetStatusName(s) + " (" + cublasLtGetStatusString(s) + ")");
}

}  // namespace multinorm::cuda
