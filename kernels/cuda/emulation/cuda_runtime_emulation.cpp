// The part of the CUDA runtime API the CUDA backend calls, for the emulated build: "device" memory is
// host memory, but every allocation is tracked so copies are checked for their direction (a host
// pointer used where device memory is expected is an error here, as it would be on a GPU), and
// streams are in-order by construction (launches run synchronously).
#include <sys/sysinfo.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "cuda_emulation.h"
#include "device_memory.h"
#include "launch_limits.h"

namespace {

thread_local cudaError_t t_last_error = cudaSuccess;

bool is_device(const void* p, size_t bytes) { return cuda_emu::device::contains(p, bytes); }

cudaError_t set(cudaError_t e) {
  if (e != cudaSuccess) t_last_error = e;
  return e;
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
cudaError_t cudaDriverGetVersion(int* v) {
  *v = CUDART_VERSION;  // the emulated "driver" is as new as the headers
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (device != 0) return set(cudaErrorInvalidDevice);
  switch (attr) {
    // An A100's (SXM, sm_80): the smallest target, whose limits the emulation enforces (launch_limits.h).
    case cudaDevAttrMultiProcessorCount: *value = 108; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = 163 * 1024; break;
    case cudaDevAttrComputeCapabilityMajor: *value = 8; break;
    case cudaDevAttrComputeCapabilityMinor: *value = 0; break;
    default: *value = 0;
  }
  return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  // The emulated device has the machine's RAM.
  *total_bytes = cuda_emu::device::capacity();
  const size_t used = cuda_emu::device::bytes_in_use();
  *free_bytes = *total_bytes > used ? *total_bytes - used : 0;
  return cudaSuccess;
}
cudaError_t cudaMalloc(void** p, size_t bytes) {
  // Guarded pages, poisoned with NaN: device_memory.h. A request larger than what is free fails as on a GPU.
  *p = cuda_emu::device::allocate(bytes);
  return *p ? cudaSuccess : set(cudaErrorMemoryAllocation);
}
cudaError_t cudaFree(void* p) {
  if (!p) return cudaSuccess;
  return cuda_emu::device::release(p) ? cudaSuccess : set(cudaErrorInvalidValue);
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
// Events: work is done when it is issued here, so an event is complete once recorded; it keeps the
// host's clock at recording, which is when the (synchronous) work before it ended.
struct EmulatedEvent {
  bool recorded = false;
  bool timing = true;
  std::chrono::steady_clock::time_point at;
};
static EmulatedEvent* event_of(cudaEvent_t e) { return reinterpret_cast<EmulatedEvent*>(e); }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags) {
  auto* ev = new EmulatedEvent;
  ev->timing = !(flags & cudaEventDisableTiming);
  *e = reinterpret_cast<cudaEvent_t>(ev);
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete event_of(e);
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t) {
  if (!e) return set(cudaErrorInvalidValue);
  event_of(e)->recorded = true;
  event_of(e)->at = std::chrono::steady_clock::now();
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t e) { return e ? cudaSuccess : set(cudaErrorInvalidValue); }
cudaError_t cudaEventSynchronize(cudaEvent_t e) { return e ? cudaSuccess : set(cudaErrorInvalidValue); }
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t stop) {
  if (!start || !stop || !event_of(start)->recorded || !event_of(stop)->recorded) return set(cudaErrorInvalidResourceHandle);
  if (!event_of(start)->timing || !event_of(stop)->timing) return set(cudaErrorInvalidResourceHandle);
  *ms = std::chrono::duration<float, std::milli>(event_of(stop)->at - event_of(start)->at).count();
  return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t e, unsigned) {
  // Waiting on an event never recorded is legal CUDA (a no-op) but always a bug in this backend.
  return e && event_of(e)->recorded ? cudaSuccess : set(cudaErrorInvalidValue);
}
cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }
cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) return set(cuda_emu::limits::set_max_dynamic_shared(func, value));
  return cudaSuccess;  // the others (carve-out, cluster shapes) are hints the emulation has no use for
}
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
