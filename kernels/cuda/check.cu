// Error messages of the CUDA backend (both builds).
#include "check.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

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
  static std::mutex mu;
  static std::map<const void*, size_t> allowed;  // per kernel: the attribute set so far
  std::lock_guard<std::mutex> lock(mu);
  size_t& current = allowed[kernel];
  if (bytes <= current) return;
  const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  if (e != cudaSuccess) {
    cudaGetLastError();  // not sticky: clear it
    throw Error(std::string("CUDA kernel ") + name + " needs " + std::to_string(bytes) +
                " B of dynamic shared memory, more than this device lets a block have (cudaFuncSetAttribute: " + cudaGetErrorName(e) + ")");
  }
  current = bytes;
}

namespace {
std::atomic<int64_t> g_host_waits{0};

// Queued device-to-host copies. One pinned chunk is bump-allocated; when a copy does not fit, a
// larger chunk is made and the old one kept until its copies are delivered (the device may still be
// writing it). With nothing pending the offset goes back to 0: after the first update no allocation.
struct QueuedCopy {
  uint64_t seq;  // queue order
  cudaStream_t stream;
  void* host_dst;
  const char* staged;
  int64_t bytes;
};
struct PinnedStaging {
  std::mutex mu;
  std::vector<QueuedCopy> pending;
  uint64_t next_seq = 0;
  char* chunk = nullptr;
  int64_t capacity = 0, used = 0;
  std::vector<char*> retired;  // outgrown chunks that pending copies still point into
};
PinnedStaging& staging() {
  static PinnedStaging* s = new PinnedStaging;  // never destroyed: backends may outlive static destructors
  return *s;
}
// Delivers the copies on `stream` queued before `before` (those queued before the wait began: a
// copy another thread queues meanwhile may not have run yet).
void deliver(PinnedStaging& s, cudaStream_t stream, uint64_t before) {
  size_t kept = 0;
  for (size_t i = 0; i < s.pending.size(); ++i) {
    const QueuedCopy c = s.pending[i];
    if (c.seq < before && c.stream == stream) std::memcpy(c.host_dst, c.staged, static_cast<size_t>(c.bytes));
    else s.pending[kept++] = c;
  }
  s.pending.resize(kept);
  if (s.pending.empty()) {
    for (char* p : s.retired) cudaFreeHost(p);
    s.retired.clear();
    s.used = 0;
  }
}
}  // namespace

void wait_for_stream(cudaStream_t stream, const std::string& what) {
  g_host_waits.fetch_add(1, std::memory_order_relaxed);
  PinnedStaging& s = staging();
  uint64_t before = 0;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    before = s.next_seq;
  }
  MN_CUDA_CHECK(cudaStreamSynchronize(stream), what);
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.pending.empty()) deliver(s, stream, before);
}
int64_t host_waits() { return g_host_waits.load(std::memory_order_relaxed); }

void queue_copy_to_host(void* host_dst, const void* device_src, int64_t bytes, cudaStream_t stream) {
  if (bytes <= 0) return;
  // In a graph the copy would run at every replay, long after this bookkeeping delivered it once.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  MN_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture), "a queued device-to-host copy");
  if (capture != cudaStreamCaptureStatusNone) throw Error("a queued device-to-host copy while the stream is capturing a graph (queue it after the replay)");
  PinnedStaging& s = staging();
  std::lock_guard<std::mutex> lock(s.mu);
  const int64_t need = (bytes + 255) / 256 * 256;  // each copy 256-byte aligned in the chunk
  if (s.used + need > s.capacity) {
    const int64_t grown = std::max<int64_t>({2 * s.capacity, s.used + need, 64 * 1024});
    char* fresh = nullptr;
    MN_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&fresh), static_cast<size_t>(grown)),
                  "pinned staging of " + std::to_string(grown) + " bytes for queued device-to-host copies");
    if (s.chunk) {
      if (s.pending.empty()) cudaFreeHost(s.chunk);
      else s.retired.push_back(s.chunk);
    }
    s.chunk = fresh, s.capacity = grown, s.used = 0;
  }
  char* staged = s.chunk + s.used;
  s.used += need;
  MN_CUDA_CHECK(cudaMemcpyAsync(staged, device_src, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost, stream),
                "a queued device-to-host copy (" + std::to_string(bytes) + " bytes)");
  s.pending.push_back({s.next_seq++, stream, host_dst, staged, bytes});
}

int64_t queued_copies(cudaStream_t stream) {
  PinnedStaging& s = staging();
  std::lock_guard<std::mutex> lock(s.mu);
  return std::count_if(s.pending.begin(), s.pending.end(), [&](const QueuedCopy& c) { return c.stream == stream; });
}

void discard_queued_copies(cudaStream_t stream) {
  cudaStreamSynchronize(stream);
  cudaGetLastError();
  PinnedStaging& s = staging();
  std::lock_guard<std::mutex> lock(s.mu);
  s.pending.erase(std::remove_if(s.pending.begin(), s.pending.end(), [&](const QueuedCopy& c) { return c.stream == stream; }),
                  s.pending.end());
  if (s.pending.empty()) {
    for (char* p : s.retired) cudaFreeHost(p);
    s.retired.clear();
    s.used = 0;
  }
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
