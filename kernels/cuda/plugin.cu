// The CUDA backend plugin: device detection. Built only when nvcc is found (MULTINORM_CUDA=AUTO|ON),
// for sm_80 and sm_90, with the CUDA runtime linked statically so the plugin itself loads wherever
// glibc does and reports a missing driver through cudaGetDeviceCount.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>

#include "multinorm/cuda_plugin_abi.h"

namespace {
void write_error(char* err, size_t len, const char* what, cudaError_t e) {
  if (err && len) std::snprintf(err, len, "%s: %s (%s, code %d)", what, cudaGetErrorString(e), cudaGetErrorName(e), static_cast<int>(e));
}
}  // namespace

extern "C" int multinorm_cuda_plugin_abi(void) { return MULTINORM_CUDA_PLUGIN_ABI; }

extern "C" int multinorm_cuda_runtime_version(void) { return CUDART_VERSION; }

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
  cudaDeviceProp prop;
  const cudaError_t e = cudaGetDeviceProperties(&prop, device);
  if (e != cudaSuccess) {
    write_error(err, err_len, "cudaGetDeviceProperties", e);
    return -1;
  }
  std::memset(info, 0, sizeof(*info));
  std::snprintf(info->name, sizeof(info->name), "%s", prop.name);
  info->cc_major = prop.major;
  info->cc_minor = prop.minor;
  info->total_memory_bytes = prop.totalGlobalMem;
  info->multiprocessors = prop.multiProcessorCount;
  return 0;
}
