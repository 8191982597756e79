// Error messages of the CUDA backend (both builds).
#include "check.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
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
std::atomic<int64_t> g_host_waits{0}, g_host_drains{0}, g_work_issued{0};

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
  std::map<cudaStream_t, int64_t> stream_waits;  // wait_for_stream calls per stream
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

void note_work_issued() { g_work_issued.fetch_add(1, std::memory_order_relaxed); }
int64_t work_issued() { return g_work_issued.load(std::memory_order_relaxed); }
int64_t host_drains() { return g_host_drains.load(std::memory_order_relaxed); }

uint64_t queued_copies_issued() {
  PinnedStaging& s = staging();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.next_seq;
}

void wait_for_event(cudaEvent_t event, cudaStream_t stream, uint64_t copies_before, int64_t work_at_record, const std::string& what) {
  g_host_waits.fetch_add(1, std::memory_order_relaxed);
  if (work_issued() == work_at_record) g_host_drains.fetch_add(1, std::memory_order_relaxed);
  MN_CUDA_CHECK(cudaEventSynchronize(event), what);
  PinnedStaging& s = staging();
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.pending.empty()) deliver(s, stream, copies_before);
}

void wait_for_stream(cudaStream_t stream, const std::string& what) {
  g_host_waits.fetch_add(1, std::memory_order_relaxed);
  g_host_drains.fetch_add(1, std::memory_order_relaxed);
  PinnedStaging& s = staging();
  uint64_t before = 0;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    before = s.next_seq;
  }
  MN_CUDA_CHECK(cudaStreamSynchronize(stream), what);
  std::lock_guard<std::mutex> lock(s.mu);
  ++s.stream_waits[stream];
  if (!s.pending.empty()) deliver(s, stream, before);
}
int64_t stream_waits(cudaStream_t stream) {
  PinnedStaging& s = staging();
  std::lock_guard<std::mutex> lock(s.mu);
  const auto it = s.stream_waits.find(stream);
  return it == s.stream_waits.end() ? 0 : it->second;
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
  note_work_issued();
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

namespace {
// Host-to-device copies staged in a pinned ring: a copy from pageable memory may make the driver
// wait for the stream before it stages the bytes (the CUDA runtime's API synchronisation notes),
// which would stall the host behind every queued kernel. An upload takes the next bytes of the ring
// and records an event after its copy; the ring's bytes are written again only once that event has
// passed (the host waits for it, counted, only when it has run a whole ring ahead of the device).
struct PinnedUploads {
  std::mutex mu;
  char* ring = nullptr;
  int64_t head = 0;
  struct InFlight {
    int64_t begin, end;
    cudaEvent_t done;
    int64_t work;  // work_issued() when it was recorded
  };
  std::deque<InFlight> in_flight;  // in ring order
  std::vector<cudaEvent_t> spare;
};
PinnedUploads& uploads() {
  static PinnedUploads* u = new PinnedUploads;  // never destroyed, as the staging above
  return *u;
}
}  // namespace

void upload_to_device(void* device_dst, const void* host_src, int64_t bytes, cudaStream_t stream, const std::string& what) {
  if (bytes <= 0) return;
  if (bytes > kPinnedUploadBytes / 4) throw Error(what + ": " + std::to_string(bytes) + " bytes is more than a staged upload takes");
  PinnedUploads& u = uploads();
  std::lock_guard<std::mutex> lock(u.mu);
  if (!u.ring)
    MN_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&u.ring), static_cast<size_t>(kPinnedUploadBytes)), "the pinned ring of host-to-device uploads");
  const int64_t need = (bytes + 255) / 256 * 256;
  if (u.head + need > kPinnedUploadBytes) u.head = 0;
  const int64_t begin = u.head, end = begin + need;
  // Free the ring's bytes [begin, end): the uploads there, the oldest in flight, must have been copied.
  while (!u.in_flight.empty()) {
    const PinnedUploads::InFlight& f = u.in_flight.front();
    const bool overlaps = f.begin < end && begin < f.end;
    const cudaError_t q = cudaEventQuery(f.done);
    if (q != cudaSuccess && q != cudaErrorNotReady) MN_CUDA_CHECK(q, what);
    if (q == cudaErrorNotReady) {
      if (!overlaps) break;
      g_host_waits.fetch_add(1, std::memory_order_relaxed);
      if (work_issued() == f.work) g_host_drains.fetch_add(1, std::memory_order_relaxed);
      MN_CUDA_CHECK(cudaEventSynchronize(f.done), what + " (waiting for the pinned upload ring)");
    }
    u.spare.push_back(f.done);
    u.in_flight.pop_front();
  }
  std::memcpy(u.ring + begin, host_src, static_cast<size_t>(bytes));
  MN_CUDA_CHECK(cudaMemcpyAsync(device_dst, u.ring + begin, static_cast<size_t>(bytes), cudaMemcpyHostToDevice, stream),
                what + " (" + std::to_string(bytes) + " bytes)");
  note_work_issued();
  cudaEvent_t done = nullptr;
  if (!u.spare.empty()) {
    done = u.spare.back();
    u.spare.pop_back();
  } else {
    MN_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "an upload's event");
  }
  MN_CUDA_CHECK(cudaEventRecord(done, stream), what + " (its event)");
  u.in_flight.push_back({begin, end, done, work_issued()});
  u.head = end;
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
