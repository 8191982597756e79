// The CUDA backend plugin's C interface (include/multinorm/cuda_plugin_abi.h): device detection and
// the backend factory. nvcc builds it into libmultinorm_cuda.so (sm_80 + sm_90, the CUDA runtime
// linked statically so the plugin loads wherever glibc does and reports a missing driver through
// cudaGetDeviceCount); g++ builds the same file into libmultinorm_cuda_emulated.so, whose one
// "device" is the CPU emulation.
#include <cstdio>
#include <cstring>
#include <exception>

#include "cuda_compat.h"
#include "multinorm/backend.h"
#include "multinorm/cuda_plugin_abi.h"

namespace multinorm::cuda {
Backend* create_backend(int device);  // cuda_backend.cu
}

namespace {
void write_error(char* err, size_t len, const char* what, cudaError_t e) {
  if (err && len) std::snprintf(err, len, "%s: %s (%s, code %d)", what, cudaGetErrorString(e), cudaGetErrorName(e), static_cast<int>(e));
}
}  // namespace

extern "C" int multinorm_cuda_plugin_abi(void) { return MULTINORM_CUDA_PLUGIN_ABI; }

extern "C" int multinorm_cuda_runtime_version(void) { return CUDART_VERSION; }

extern "C" int multinorm_cuda_plugin_emulated(void) { return MN_EMULATED; }

extern "C" int multinorm_cuda_device_count(char* err, size_t err_len) {
  int n = 0;
  // Any error (no driver: 35, stub driver: 34, no device: 100, ...) means "no usable GPU".
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    write_error(err, err_len, "cudaGetDeviceCount", e);
    return -1;
  }
  return n;
}

extern "C" int multinorm_cuda_device_query(int device, multinorm_cuda_device_info* info, char* err, size_t err_len) {
  std::memset(info, 0, sizeof(*info));
#if MN_EMULATED
  if (device < 0 || device >= cuda_emu::visible_devices()) {
    if (err && err_len) std::snprintf(err, err_len, "no emulated CUDA device %d (%d visible)", device, cuda_emu::visible_devices());
    return -1;
  }
  std::snprintf(info->name, sizeof(info->name), "CUDA emulation on the CPU (test instrument), device %d",
                cuda_emu::physical_device(device));
  info->cc_major = 9;
  size_t free_b = 0;
  cudaMemGetInfo(&free_b, &info->total_memory_bytes);
  cudaDeviceGetAttribute(&info->multiprocessors, cudaDevAttrMultiProcessorCount, device);
#else
  cudaDeviceProp prop;
  const cudaError_t e = cudaGetDeviceProperties(&prop, device);
  if (e != cudaSuccess) {
    write_error(err, err_len, "cudaGetDeviceProperties", e);
    return -1;
  }
  std::snprintf(info->name, sizeof(info->name), "%s", prop.name);
  info->cc_major = prop.major;
  info->cc_minor = prop.minor;
  info->total_memory_bytes = prop.totalGlobalMem;
  info->multiprocessors = prop.multiProcessorCount;
#endif
  return 0;
}

extern "C" void* multinorm_cuda_create_backend(int device, char* err, size_t err_len) {
  try {
    return multinorm::cuda::create_backend(device);
  } catch (const std::exception& e) {
    if (err && err_len) std::snprintf(err, err_len, "%s", e.what());
    return nullptr;
  }
}
