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
#include "ring_spans.h"

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

// Queued device-to-host copies, per stream: a pinned ring whose spans are given back as their copies
// are delivered (a stream's deliveries are always its oldest copies), so a host that always keeps
// the next update's copies queued (deferred statistics) reuses the same bytes. When the ring is full
// of undelivered copies, a ring twice the size takes over and the old one is freed once its copies
// are delivered (the device may still be writing it).
struct QueuedCopy {
  uint64_t seq;  // queue order, over every stream
  void* host_dst;
  const char* staged;
  int64_t bytes;
  bool in_ring;  // holds a span of the stream's current ring (else of a retired one)
};
struct StreamStaging {
  char* ring = nullptr;
  RingSpans spans{0};
  std::deque<QueuedCopy> pending;  // in queue order
  struct Retired {
    char* ring;
    int64_t bytes, undelivered;
  };
  std::vector<Retired> retired;  // outgrown rings, freed once their copies are delivered
  int64_t stream_waits = 0;  // wait_for_stream calls
};
struct PinnedStaging {
  std::mutex mu;
  uint64_t next_seq = 0;
  std::map<cudaStream_t, StreamStaging> streams;
};
PinnedStaging& staging() {
  static PinnedStaging* s = new PinnedStaging;  // never destroyed: backends may outlive static destructors
  return *s;
}
// Delivers the copies on `stream` queued before `before` (those queued before the wait began: a
// copy another thread queues meanwhile may not have run yet), oldest first.
void deliver(StreamStaging& st, uint64_t before) {
  while (!st.pending.empty() && st.pending.front().seq < before) {
    const QueuedCopy c = st.pending.front();
    st.pending.pop_front();
    std::memcpy(c.host_dst, c.staged, static_cast<size_t>(c.bytes));
    if (c.in_ring) {
      st.spans.give_back_oldest();
    } else {
      for (StreamStaging::Retired& r : st.retired)
        if (c.staged >= r.ring && c.staged < r.ring + r.bytes) --r.undelivered;
    }
  }
  for (size_t i = 0; i < st.retired.size();)
    if (st.retired[i].undelivered == 0) cudaFreeHost(st.retired[i].ring), st.retired.erase(st.retired.begin() + static_cast<long>(i));
    else ++i;
}
}  // namespace

void note_work_issued() { g_work_issued.fetch_add(1, std::memory_order_relaxed); }
int64_t work_issued() { return g_work_issued.load(std::memory_order_relaxed); }
int64_t host_drains() { return g_host_drains.load(std::memory_order_relaxed); }
void count_host_wait(bool drain) {
  g_host_waits.fetch_add(1, std::memory_order_relaxed);
  if (drain) g_host_drains.fetch_add(1, std::memory_order_relaxed);
}

uint64_t queued_copies_issued() {
  PinnedStaging& s = staging();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.next_seq;
}

void wait_for_event(cudaEvent_t event, cudaStream_t stream, uint64_t copies_before, int64_t work_at_record, const std::string& what) {
  count_host_wait(work_issued() == work_at_record);
  MN_CUDA_CHECK(cudaEventSynchronize(event), what);
  PinnedStaging& s = staging();
  std::lock_guard<std::mutex> lock(s.mu);
  if (auto it = s.streams.find(stream); it != s.streams.end()) deliver(it->second, copies_before);
}

void wait_for_stream(cudaStream_t stream, const std::string& what) {
  count_host_wait(true);
  PinnedStaging& s = staging();
  uint64_t before = 0;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    before = s.next_seq;
  }
  MN_CUDA_CHECK(cudaStreamSynchronize(stream), what);
  std::lock_guard<std::mutex> lock(s.mu);
  StreamStaging& st = s.streams[stream];
  ++st.stream_waits;
  deliver(st, before);
}
int64_t stream_waits(cudaStream_t stream) {
  PinnedStaging& s = staging();
  std::lock_guard<std::mutex> lock(s.mu);
  const auto it = s.streams.find(stream);
  return it == s.streams.end() ? 0 : it->second.stream_waits;
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
  StreamStaging& st = s.streams[stream];
  const int64_t need = (bytes + 255) / 256 * 256;  // each copy 256-byte aligned in the ring
  int64_t offset = st.spans.take(need);
  if (offset < 0) {  // full of undelivered copies (or none yet): a larger ring takes over
    const int64_t grown = std::max<int64_t>({2 * st.spans.capacity(), 4 * need, 64 * 1024});
    char* fresh = nullptr;
    MN_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&fresh), static_cast<size_t>(grown)),
                  "pinned staging of " + std::to_string(grown) + " bytes for queued device-to-host copies");
    if (st.ring) {
      int64_t in_ring = 0;
      for (QueuedCopy& c : st.pending) in_ring += c.in_ring, c.in_ring = false;
      if (in_ring == 0) cudaFreeHost(st.ring);
      else st.retired.push_back({st.ring, st.spans.capacity(), in_ring});
    }
    st.ring = fresh;
    st.spans = RingSpans(grown);
    offset = st.spans.take(need);
  }
  char* staged = st.ring + offset;
  MN_CUDA_CHECK(cudaMemcpyAsync(staged, device_src, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost, stream),
                "a queued device-to-host copy (" + std::to_string(bytes) + " bytes)");
  note_work_issued();
  st.pending.push_back({s.next_seq++, host_dst, staged, bytes, true});
}

int64_t queued_copies(cudaStream_t stream) {
  PinnedStaging& s = staging();
  std::lock_guard<std::mutex> lock(s.mu);
  const auto it = s.streams.find(stream);
  return it == s.streams.end() ? 0 : static_cast<int64_t>(it->second.pending.size());
}

void discard_queued_copies(cudaStream_t stream) {
  cudaStreamSynchronize(stream);
  cudaGetLastError();
  PinnedStaging& s = staging();
  std::lock_guard<std::mutex> lock(s.mu);
  const auto it = s.streams.find(stream);
  if (it == s.streams.end()) return;
  StreamStaging& st = it->second;
  for (const auto& r : st.retired) cudaFreeHost(r.ring);
  if (st.ring) cudaFreeHost(st.ring);
  s.streams.erase(it);  // a later stream may get this handle
}

// ---- UploadRing ----------------------------------------------------------------------------------

UploadRing::UploadRing(cudaStream_t stream) : stream_(stream), spans_(kPinnedUploadBytes) {}

UploadRing::~UploadRing() {
  for (const InFlight& f : in_flight_) cudaEventDestroy(f.done);
  for (cudaEvent_t e : spare_) cudaEventDestroy(e);
  if (ring_) cudaFreeHost(ring_);
}

void UploadRing::give_back_oldest(bool wait, const std::string& what) {
  const InFlight f = in_flight_.front();
  if (wait) {
    count_host_wait(work_issued() == f.work);
    MN_CUDA_CHECK(cudaEventSynchronize(f.done), what + " (waiting for the pinned upload ring)");
  }
  in_flight_.pop_front();
  spans_.give_back_oldest();
  spare_.push_back(f.done);
}

void UploadRing::upload(void* device_dst, const void* host_src, int64_t bytes, const std::string& what) {
  if (bytes <= 0) return;
  if (bytes > kPinnedUploadBytes / 4) throw Error(what + ": " + std::to_string(bytes) + " bytes is more than a staged upload takes");
  if (!ring_)
    MN_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&ring_), static_cast<size_t>(kPinnedUploadBytes)), "the pinned ring of host-to-device uploads");
  // The uploads already copied give their bytes back (one stream: they complete oldest first).
  while (!in_flight_.empty()) {
    const cudaError_t q = cudaEventQuery(in_flight_.front().done);
    if (q == cudaErrorNotReady) break;
    MN_CUDA_CHECK(q, what);
    give_back_oldest(false, what);
  }
  const int64_t need = (bytes + 255) / 256 * 256;
  int64_t offset = spans_.take(need);
  while (offset < 0) {  // a whole ring ahead of the device: wait for the oldest upload
    give_back_oldest(true, what);
    offset = spans_.take(need);
  }
  std::memcpy(ring_ + offset, host_src, static_cast<size_t>(bytes));
  MN_CUDA_CHECK(cudaMemcpyAsync(device_dst, ring_ + offset, static_cast<size_t>(bytes), cudaMemcpyHostToDevice, stream_),
                what + " (" + std::to_string(bytes) + " bytes)");
  note_work_issued();
  cudaEvent_t done = nullptr;
  if (!spare_.empty()) {
    done = spare_.back();
    spare_.pop_back();
  } else {
    MN_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "an upload's event");
  }
  MN_CUDA_CHECK(cudaEventRecord(done, stream_), what + " (its event)");
  in_flight_.push_back({done, work_issued()});
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
