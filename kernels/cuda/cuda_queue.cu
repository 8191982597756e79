// The CUDA backend's stream and its ordering (cuda_queue.h).
#include "cuda_queue.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "check.h"
#include "multinorm/error.h"

namespace multinorm::cuda {

CudaQueue::CudaQueue() {
  MN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "creating the backend's stream");
  MN_CUDA_CHECK(cudaStreamCreateWithFlags(&loop_stream_, cudaStreamNonBlocking), "creating the backend's stream for device loops");
}

CudaQueue::~CudaQueue() {
  cudaStreamSynchronize(stream_);  // errors ignored: the late copies' destinations may be gone
  cudaGetLastError();
  for (const Graph& g : graphs_)
    if (g.exec) cudaGraphExecDestroy(g.exec);
  for (const Fence& f : fences_) cudaEventDestroy(f.event);
  for (const Upload& u : uploads_) cudaEventDestroy(u.done);
  for (cudaEvent_t e : spare_events_) cudaEventDestroy(e);
  for (const RetiredRing& r : retired_) cudaFreeHost(r.ring);
  if (late_ring_) cudaFreeHost(late_ring_);
  if (upload_ring_) cudaFreeHost(upload_ring_);
  cudaStreamDestroy(loop_stream_);
  cudaStreamDestroy(stream_);
}

cudaEvent_t CudaQueue::take_event() {
  cudaEvent_t e = nullptr;
  if (!spare_events_.empty()) {
    e = spare_events_.back();
    spare_events_.pop_back();
  } else {
    MN_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "creating an event");
  }
  return e;
}

void CudaQueue::count_wait(bool drain) {
  ++counters_.host_waits;
  counters_.host_drains += drain;
}

// ---- waits ---------------------------------------------------------------------------------------

// Delivers the late copies issued before `before` (oldest first) and frees what they held.
void CudaQueue::deliver(uint64_t before) {
  while (!late_.empty() && late_.front().seq < before) {
    const LateCopy c = late_.front();
    late_.pop_front();
    std::memcpy(c.host_dst, c.staged, static_cast<size_t>(c.bytes));
    if (c.in_ring) {
      late_spans_.give_back_oldest();
    } else {
      for (RetiredRing& r : retired_)
        if (c.staged >= r.ring && c.staged < r.ring + r.bytes) --r.undelivered;
    }
  }
  for (size_t i = 0; i < retired_.size();)
    if (retired_[i].undelivered == 0) cudaFreeHost(retired_[i].ring), retired_.erase(retired_.begin() + static_cast<long>(i));
    else ++i;
}

void CudaQueue::wait_all(const std::string& what) {
  count_wait(true);
  const uint64_t before = next_seq_;
  MN_CUDA_CHECK(cudaStreamSynchronize(stream_), what);
  ++full_waits_;
  deliver(before);
}

void CudaQueue::read(void* host_dst, const void* device_src, int64_t bytes, const std::string& what) {
  MN_CUDA_CHECK(cudaMemcpyAsync(host_dst, device_src, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost, issue()),
                what + " (" + std::to_string(bytes) + " bytes to the host)");
  wait_all(what);
}

void CudaQueue::wait_for_event(cudaEvent_t event, int64_t work_at_record, const std::string& what) {
  count_wait(work_ == work_at_record);
  MN_CUDA_CHECK(cudaEventSynchronize(event), what);
}

// ---- fences and late copies ----------------------------------------------------------------------

int64_t CudaQueue::fence() {
  if (capturing_) throw Error("a fence while the stream is capturing a graph (its event would be a graph node)");
  Fence f;
  f.event = take_event();
  MN_CUDA_CHECK(cudaEventRecord(f.event, stream_), "recording a fence");
  f.id = ++fences_recorded_;
  f.copies = next_seq_;
  f.work = work_;
  f.full_waits = full_waits_;
  fences_.push_back(f);
  return f.id;
}

void CudaQueue::wait(int64_t id) {
  if (id <= fences_waited_) return;
  if (id > fences_recorded_) throw Error("CUDA queue: wait(" + std::to_string(id) + "): no such fence");
  while (!fences_.empty() && fences_.front().id <= id) {
    const Fence f = fences_.front();
    // A wait for the whole stream since the fence was recorded finished it and delivered its copies.
    if (f.id == id && full_waits_ == f.full_waits) {
      wait_for_event(f.event, f.work, "waiting for a fence");
      deliver(f.copies);
    }
    fences_.pop_front();
    spare_events_.push_back(f.event);
  }
  fences_waited_ = id;
}

void CudaQueue::copy_to_host_later(void* host_dst, const void* device_src, int64_t bytes) {
  if (bytes <= 0) return;
  // In a graph the copy would run at every replay, long after this bookkeeping delivered it once.
  if (capturing_) throw Error("a late device-to-host copy while the stream is capturing a graph (issue it after the replay)");
  const int64_t need = (bytes + 255) / 256 * 256;  // each copy 256-byte aligned in the ring
  int64_t offset = late_spans_.take(need);
  if (offset < 0) {  // full of undelivered copies (or none yet): a ring twice the size takes over
    const int64_t grown = std::max<int64_t>({2 * late_spans_.capacity(), 4 * need, 64 * 1024});
    char* fresh = nullptr;
    MN_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&fresh), static_cast<size_t>(grown)),
                  "pinned staging of " + std::to_string(grown) + " bytes for late device-to-host copies");
    if (late_ring_) {
      int64_t in_ring = 0;
      for (LateCopy& c : late_) in_ring += c.in_ring, c.in_ring = false;
      if (in_ring == 0) cudaFreeHost(late_ring_);
      else retired_.push_back({late_ring_, late_spans_.capacity(), in_ring});
    }
    late_ring_ = fresh;
    late_spans_ = RingSpans(grown);
    offset = late_spans_.take(need);
  }
  char* staged = late_ring_ + offset;
  MN_CUDA_CHECK(cudaMemcpyAsync(staged, device_src, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost, issue()),
                "a late device-to-host copy (" + std::to_string(bytes) + " bytes)");
  late_.push_back({next_seq_++, host_dst, staged, bytes, true});
}

// ---- uploads -------------------------------------------------------------------------------------

void CudaQueue::free_upload_span(bool wait, const std::string& what) {
  const Upload u = uploads_.front();
  if (wait) {
    count_wait(work_ == u.work);
    MN_CUDA_CHECK(cudaEventSynchronize(u.done), what + " (waiting for the pinned upload ring)");
  }
  uploads_.pop_front();
  upload_spans_.give_back_oldest();
  spare_events_.push_back(u.done);
}

void CudaQueue::upload(void* device_dst, const void* host_src, int64_t bytes, const std::string& what) {
  if (bytes <= 0) return;
  if (capturing_)
    throw Error(what + " (" + std::to_string(bytes) + " bytes to the device) while the stream is capturing a graph (copy before the capture or the replay)");
  if (bytes > kPinnedUploadBytes / 4) {  // staged by the driver before cudaMemcpyAsync returns
    MN_CUDA_CHECK(cudaMemcpyAsync(device_dst, host_src, static_cast<size_t>(bytes), cudaMemcpyHostToDevice, issue()),
                  what + " (" + std::to_string(bytes) + " bytes)");
    return;
  }
  if (!upload_ring_)
    MN_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&upload_ring_), static_cast<size_t>(kPinnedUploadBytes)), "the pinned upload ring");
  while (!uploads_.empty()) {  // the uploads already copied give their bytes back (oldest first)
    const cudaError_t q = cudaEventQuery(uploads_.front().done);
    if (q == cudaErrorNotReady) break;
    MN_CUDA_CHECK(q, what);
    free_upload_span(false, what);
  }
  const int64_t need = (bytes + 255) / 256 * 256;
  int64_t offset = upload_spans_.take(need);
  while (offset < 0) {  // a whole ring ahead of the device: wait for the oldest upload
    free_upload_span(true, what);
    offset = upload_spans_.take(need);
  }
  std::memcpy(upload_ring_ + offset, host_src, static_cast<size_t>(bytes));
  MN_CUDA_CHECK(cudaMemcpyAsync(device_dst, upload_ring_ + offset, static_cast<size_t>(bytes), cudaMemcpyHostToDevice, issue()),
                what + " (" + std::to_string(bytes) + " bytes)");
  const cudaEvent_t done = take_event();
  MN_CUDA_CHECK(cudaEventRecord(done, stream_), what + " (its event)");
  uploads_.push_back({done, work_});
}

// ---- graphs --------------------------------------------------------------------------------------
// Thread-local capture mode: an allocation or a host wait by this thread during a capture is an
// error, not a silently broken graph (NCCL's own threads stay free to call the runtime). Not while
// profiling (its events would be graph nodes). A graph remembers buffer_moves() at its capture and is
// not replayed once it changed.

// The WHILE node is added to the graph being captured after the captured work so far, and the
// stream's capture continues after it; the body is captured into the node's own graph on the second
// stream (cudaStreamBeginCaptureToGraph), so the work issued in `body` lands there, in order.
// The calls are CUDA 13's (CUDA 12.4-12.9 spell GetCaptureInfo and AddNode differently): built with
// CUDA 12 the loop is not captured (false), and the caller's fixed count runs inside the graph.
// A runtime that refuses the loop turns loops off for this queue: refused before anything joined the
// graph, the capture goes on without it; after (a handle whose node failed stays in the graph, and
// may fail its instantiation), the capture fails, and the next one runs without loops.
bool CudaQueue::device_loop(const std::function<void(cudaStream_t, cudaGraphConditionalHandle)>& body) {
#if CUDART_VERSION >= 13000
  if (!capturing_ || device_loops_off_) return false;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  cudaGraph_t graph = nullptr;
  const cudaGraphNode_t* deps = nullptr;
  const cudaGraphEdgeData* edges = nullptr;
  size_t count = 0;
  MN_CUDA_CHECK(cudaStreamGetCaptureInfo(stream_, &status, nullptr, &graph, &deps, &edges, &count), "a device loop: the capture's graph");
  if (status != cudaStreamCaptureStatusActive) return false;  // an invalidated capture fails at its end anyway
  auto refused = [&](cudaError_t e, const char* what) {
    cudaGetLastError();
    device_loops_off_ = true;
    ++counters_.device_loops_refused;
    std::fprintf(stderr, "multinorm: CUDA graph conditional nodes refused (%s: %s): device loops run all their steps from now on\n", what,
                 cudaGetErrorString(e));
  };
  cudaGraphConditionalHandle handle = 0;
  cudaError_t e = cudaGraphConditionalHandleCreate(&handle, graph, 1, cudaGraphCondAssignDefault);
  if (e != cudaSuccess) {
    refused(e, "its condition");
    return false;
  }
  cudaGraphNodeParams params{};
  params.type = cudaGraphNodeTypeConditional;
  params.conditional.handle = handle;
  params.conditional.type = cudaGraphCondTypeWhile;
  params.conditional.size = 1;
  cudaGraphNode_t node = nullptr;
  e = cudaGraphAddNode(&node, graph, deps, edges, count, &params);
  if (e != cudaSuccess) {
    refused(e, "its WHILE node");
    throw Error("a device loop: the runtime refused its WHILE node; the capture is abandoned and the next runs without device loops");
  }
  ++loops_in_capture_;
  // From here a failure must end the capture: a WHILE node whose body never clears would never end.
  MN_CUDA_CHECK(cudaStreamUpdateCaptureDependencies(stream_, &node, nullptr, 1, cudaStreamSetCaptureDependencies),
                "a device loop: the capture continuing after its node");
  MN_CUDA_CHECK(cudaStreamBeginCaptureToGraph(loop_stream_, params.conditional.phGraph_out[0], nullptr, nullptr, 0, cudaStreamCaptureModeThreadLocal),
                "a device loop: capturing its body");
  cudaGraph_t captured = nullptr;
  try {
    body(loop_stream_, handle);
  } catch (...) {
    cudaStreamEndCapture(loop_stream_, &captured);
    cudaGetLastError();
    throw;
  }
  MN_CUDA_CHECK(cudaStreamEndCapture(loop_stream_, &captured), "a device loop: ending its body's capture");
  return true;
#else
  (void)body;
  return false;
#endif
}

bool CudaQueue::begin_capture() {
  if (profiler::g_on) return false;
  loops_in_capture_ = 0;
  MN_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "beginning a graph capture");
  capturing_ = true;
  return true;
}

int64_t CudaQueue::end_capture() {
  capturing_ = false;
  cudaGraph_t graph = nullptr;
  MN_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph), "ending a graph capture (an op allocated, waited or copied to the host)");
  cudaGraphExec_t exec = nullptr;
  const cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  if (e != cudaSuccess && loops_in_capture_ > 0 && !device_loops_off_) {  // the next capture without them
    device_loops_off_ = true;
    ++counters_.device_loops_refused;
    std::fprintf(stderr, "multinorm: a graph with device loops (WHILE nodes) failed to instantiate (%s): device loops run all their steps from now on\n",
                 cudaGetErrorString(e));
  }
  MN_CUDA_CHECK(e, "instantiating a captured graph");
  counters_.device_loops += loops_in_capture_;
  graphs_.push_back({exec, moves_});
  return static_cast<int64_t>(graphs_.size()) - 1;
}

void CudaQueue::abandon_capture() {
  capturing_ = false;
  cudaGraph_t graph = nullptr;
  if (cudaStreamEndCapture(stream_, &graph) == cudaSuccess && graph) cudaGraphDestroy(graph);
  cudaGetLastError();
}

bool CudaQueue::replay(int64_t id) {
  if (id < 0 || static_cast<size_t>(id) >= graphs_.size() || !graphs_[static_cast<size_t>(id)].exec)
    throw Error("CUDA queue: no graph " + std::to_string(id));
  const Graph& g = graphs_[static_cast<size_t>(id)];
  if (profiler::g_on || g.moves != moves_) return false;
  MN_CUDA_CHECK(cudaGraphLaunch(g.exec, issue()), "replaying graph " + std::to_string(id));
  ++counters_.graph_replays;
  return true;
}

void CudaQueue::release_graph(int64_t id) {
  if (id < 0 || static_cast<size_t>(id) >= graphs_.size()) return;
  Graph& g = graphs_[static_cast<size_t>(id)];
  if (g.exec) cudaGraphExecDestroy(g.exec);
  g = {};
}

}  // namespace multinorm::cuda
