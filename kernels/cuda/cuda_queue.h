// CudaQueue: the CUDA backend's stream and everything that orders work on it (WorkQueue): fences,
// copies to the host delivered at a later wait, small uploads through a pinned ring, CUDA graphs, and
// the count of the host's waits. One object per backend, owned by it; nothing here is process-global.
// Every host wait of the backend goes through this object (tests/lint_cuda.sh enforces it), so its
// counters are exact: host_waits, and host_drains (waits after which the device had nothing queued).
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "cuda_compat.h"
#include "multinorm/work_queue.h"
#include "ring_spans.h"

namespace multinorm::cuda {

// At most a quarter of this goes through the ring in one copy; larger copies are staged by the driver.
constexpr int64_t kPinnedUploadBytes = 8ll << 20;

class CudaQueue final : public WorkQueue {
 public:
  CudaQueue();
  ~CudaQueue() override;
  CudaQueue(const CudaQueue&) = delete;
  CudaQueue& operator=(const CudaQueue&) = delete;

  // The stream, for work about to be issued on it: counted, so a wait can tell whether the device
  // had work left after the point it waited for. Every op of the backend gets its stream here.
  cudaStream_t issue() {
    ++work_;
    return stream_;
  }
  cudaStream_t stream() const { return stream_; }
  bool capturing() const { return capturing_; }
  // A buffer a graph may hold the address of has moved (scratch grew, a descriptor table started over).
  void note_buffers_moved() { ++moves_; }

  // The host waits for everything issued so far (a drain), then delivers the late copies.
  void wait_all() override { wait_all("a synchronisation"); }
  void wait_all(const std::string& what);
  // src (device) -> dst (host), waited for: a drain.
  void read(void* host_dst, const void* device_src, int64_t bytes, const std::string& what);
  // A host-to-device copy the caller may reuse `host_src` after: small ones staged in the pinned
  // ring (a copy from pageable memory may make the driver wait for the stream first), large ones
  // staged by the driver. Refused while capturing (a replay would copy whatever the ring holds).
  void upload(void* device_dst, const void* host_src, int64_t bytes, const std::string& what);
  // A host wait this object did not make (NCCL's completion poll): counted, as a drain when `drain`.
  void count_wait(bool drain);

  int64_t fence() override;
  void wait(int64_t fence) override;
  void copy_to_host_later(void* host_dst, const void* device_src, int64_t bytes) override;

  // The device loop of kernels.h (DeviceLoop): while capturing, `body` becomes the body of a CUDA
  // graph WHILE node (a conditional node: built with CUDA 13), captured on the queue's second stream,
  // and true is returned; otherwise false. Its condition starts at 1 at each launch of the graph.
  bool device_loop(const std::function<void(cudaStream_t, cudaGraphConditionalHandle)>& body);

  bool begin_capture() override;
  int64_t end_capture() override;
  void abandon_capture() override;
  bool replay(int64_t graph) override;
  void release_graph(int64_t graph) override;
  int64_t buffer_moves() const override { return moves_; }
  QueueCounters counters() const override { return counters_; }

 private:
  struct LateCopy {  // a copy_to_host_later in flight, staged in the pinned ring
    uint64_t seq;
    void* host_dst;
    const char* staged;
    int64_t bytes;
    bool in_ring;  // holds a span of the current ring (else of a retired one)
  };
  struct RetiredRing {  // outgrown, freed once its copies are delivered (the device may still write it)
    char* ring;
    int64_t bytes, undelivered;
  };
  struct Upload {  // an upload in flight: its span of the upload ring is free once `done` passed
    cudaEvent_t done;
    int64_t work;
  };
  struct Fence {
    int64_t id = 0;
    cudaEvent_t event = nullptr;
    uint64_t copies = 0;  // late copies issued before it
    int64_t work = 0;     // work issued before it
    int64_t full_waits = 0;  // wait_all() calls before it
  };
  void deliver(uint64_t before);
  void wait_for_event(cudaEvent_t event, int64_t work_at_record, const std::string& what);
  void free_upload_span(bool wait, const std::string& what);
  cudaEvent_t take_event();

  cudaStream_t stream_ = nullptr;
  cudaStream_t loop_stream_ = nullptr;  // captures device loops' bodies into their WHILE nodes; never runs work itself
  bool device_loops_off_ = false;       // the runtime refused a WHILE node (or a graph holding one): none from then on
  int64_t loops_in_capture_ = 0;        // WHILE nodes in the capture under way
  int64_t work_ = 0, moves_ = 0, full_waits_ = 0;
  QueueCounters counters_;
  // late copies
  char* late_ring_ = nullptr;
  RingSpans late_spans_{0};
  std::deque<LateCopy> late_;
  std::vector<RetiredRing> retired_;
  uint64_t next_seq_ = 0;
  // uploads
  char* upload_ring_ = nullptr;
  RingSpans upload_spans_{kPinnedUploadBytes};
  std::deque<Upload> uploads_;
  // fences
  std::deque<Fence> fences_;  // recorded, not waited yet, in order
  std::vector<cudaEvent_t> spare_events_;
  int64_t fences_recorded_ = 0, fences_waited_ = 0;
  // graphs
  struct Graph {
    cudaGraphExec_t exec = nullptr;  // null once released
    int64_t moves = 0;               // buffer_moves() at its capture
  };
  std::vector<Graph> graphs_;  // by graph id
  bool capturing_ = false;
};

}  // namespace multinorm::cuda
