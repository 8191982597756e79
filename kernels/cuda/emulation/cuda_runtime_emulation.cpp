// The part of the CUDA runtime API the CUDA backend calls, for the emulated build: "device" memory is
// host memory, but every allocation is tracked so copies are checked for their direction (a host
// pointer used where device memory is expected is an error here, as it would be on a GPU), and
// streams are in-order by construction (launches run synchronously).
#include <sys/sysinfo.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "cuda_emulation.h"

namespace {

std::mutex g_mu;
std::map<const char*, size_t> g_device;  // emulated device allocations: base -> bytes
size_t g_device_bytes = 0;
thread_local cudaError_t t_last_error = cudaSuccess;

bool is_device(const void* p, size_t bytes) {
  std::lock_guard<std::mutex> lock(g_mu);
  const char* c = static_cast<const char*>(p);
  auto it = g_device.upper_bound(c);
  if (it == g_device.begin()) return false;
  --it;
  return c >= it->first && c + bytes <= it->first + it->second;
}

cudaError_t set(cudaError_t e) {
  if (e != cudaSuccess) t_last_error = e;
  return e;
}

size_t total_memory() {
  struct sysinfo si {};
  ::sysinfo(&si);
  return static_cast<size_t>(si.totalram) * si.mem_unit;
}

}  // namespace

extern "C" {

cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) { return set(device == 0 ? cudaSuccess : cudaErrorInvalidDevice); }
cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int* v) {
  *v = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (device != 0) return set(cudaErrorInvalidDevice);
  switch (attr) {
    case cudaDevAttrMultiProcessorCount: *value = 132; break;  // an H100 SXM's, so grids are sized as there
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = 227 * 1024; break;
    case cudaDevAttrComputeCapabilityMajor: *value = 9; break;
    case cudaDevAttrComputeCapabilityMinor: *value = 0; break;
    default: *value = 0;
  }
  return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  std::lock_guard<std::mutex> lock(g_mu);
  *total_bytes = total_memory();
  *free_bytes = *total_bytes > g_device_bytes ? *total_bytes - g_device_bytes : 0;
  return cudaSuccess;
}
cudaError_t cudaMalloc(void** p, size_t bytes) {
  *p = nullptr;
  {
    // The emulated device has the machine's RAM: a larger request fails as on a GPU (and never
    // reaches the allocator, which sanitizers would abort on).
    std::lock_guard<std::mutex> lock(g_mu);
    if (bytes > total_memory() - std::min(total_memory(), g_device_bytes)) return set(cudaErrorMemoryAllocation);
  }
  const size_t size = (bytes + 255) / 256 * 256;
  *p = std::aligned_alloc(256, size ? size : 256);
  if (!*p) return set(cudaErrorMemoryAllocation);
  std::memset(*p, 0xff, size);  // device memory starts as garbage: NaN-poisoned like shared memory
  std::lock_guard<std::mutex> lock(g_mu);
  g_device[static_cast<const char*>(*p)] = size;
  g_device_bytes += size;
  return cudaSuccess;
}
cudaError_t cudaFree(void* p) {
  if (!p) return cudaSuccess;
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_device.find(static_cast<const char*>(p));
  if (it == g_device.end()) return set(cudaErrorInvalidValue);
  g_device_bytes -= it->second;
  g_device.erase(it);
  std::free(p);
  return cudaSuccess;
}
cudaError_t cudaMallocHost(void** p, size_t bytes) {
  *p = std::malloc(bytes ? bytes : 1);
  return *p ? cudaSuccess : set(cudaErrorMemoryAllocation);
}
cudaError_t cudaFreeHost(void* p) {
  std::free(p);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t) {
  if (bytes == 0) return cudaSuccess;
  const bool dst_dev = is_device(dst, bytes), src_dev = is_device(src, bytes);
  bool ok = true;
  switch (kind) {
    case cudaMemcpyHostToDevice: ok = dst_dev && !src_dev; break;
    case cudaMemcpyDeviceToHost: ok = !dst_dev && src_dev; break;
    case cudaMemcpyDeviceToDevice: ok = dst_dev && src_dev; break;
    default: ok = false;  // the backend always says which way a copy goes
  }
  if (!ok) return set(cudaErrorInvalidValue);
  std::memmove(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  return cudaMemcpyAsync(dst, src, bytes, kind, nullptr);
}
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t) {
  if (bytes && !is_device(p, bytes)) return set(cudaErrorInvalidValue);
  std::memset(p, value, bytes);
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) {
  *s = reinterpret_cast<cudaStream_t>(new char(0));
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  delete reinterpret_cast<char*>(s);
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
// Events: work is done when it is issued here, so an event is complete once recorded.
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) {
  *e = reinterpret_cast<cudaEvent_t>(new char(0));
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete reinterpret_cast<char*>(e);
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t) {
  if (!e) return set(cudaErrorInvalidValue);
  *reinterpret_cast<char*>(e) = 1;
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t e) { return e ? cudaSuccess : set(cudaErrorInvalidValue); }
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t e, unsigned) {
  // Waiting on an event never recorded is legal CUDA (a no-op) but always a bug in this backend.
  return e && *reinterpret_cast<char*>(e) ? cudaSuccess : set(cudaErrorInvalidValue);
}
cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }
cudaError_t cudaGetLastError(void) {
  const cudaError_t e = t_last_error;
  t_last_error = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError(void) { return t_last_error; }
const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    default: return "cudaError";
  }
}
const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument (emulation: a pointer is not in emulated device memory, or a copy goes the wrong way)";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    default: return "emulated CUDA error";
  }
}

}  // extern "C"

// Whether [p, p + bytes) lies in emulated device memory (used by the emulated backend's checks).
namespace cuda_emu {
bool is_device_memory(const void* p, size_t bytes) { return is_device(p, bytes); }
}  // namespace cuda_emu
