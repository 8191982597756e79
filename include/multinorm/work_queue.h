// The order of a backend's work as the host sees it. A device backend queues each op and returns at
// once; the host says when it needs a result (a fence, then a wait for it) and may record a sequence
// of ops once and replay it as one launch (a graph). The CPU backend's ops are done when they return:
// its queue is synchronous (SynchronousQueue: waits are free, copies arrive at once, no graphs).
// Every backend hands out its queue (Backend::queue()); graphs are used through GraphCache only.
#pragma once
#include <cstdint>
#include <cstring>

#include "multinorm/error.h"

namespace multinorm {

// What the host's waits and the graphs cost so far, counted by the queue.
struct QueueCounters {
  int64_t host_waits = 0;   // the host waited for the device (a copy to the host, a fence, a synchronisation)
  int64_t host_drains = 0;  // of those, the waits after which the device had nothing queued: it idles
                            // until the host issues more
  int64_t graph_replays = 0;
  int64_t device_loops = 0;          // loops the device ends (CUDA graph WHILE nodes) in the graphs instantiated
  int64_t device_loops_refused = 0;  // the runtime refused one (then every loop runs all its steps)
};

class WorkQueue {
 public:
  virtual ~WorkQueue() = default;

  // ---- fences: a point in the work issued so far ----------------------------------------------
  // wait(f) returns once the work issued before f has finished (the work issued after it keeps the
  // device busy meanwhile) and the copy_to_host_later copies issued before f have arrived. Fences
  // increase; waiting for one at or before the latest waited is free and not counted.
  virtual int64_t fence() = 0;
  virtual void wait(int64_t fence) = 0;
  // Waits for every op issued so far (a drain: profiling, benchmarks, teardown).
  virtual void wait_all() = 0;
  // A device-to-host copy that does not wait: host_dst receives the bytes when the host waits for a
  // fence issued after this call (or wait_all); until then it keeps its old bytes and must stay valid.
  virtual void copy_to_host_later(void* host_dst, const void* src, int64_t bytes) = 0;

  // ---- graphs (GraphCache is their one user) --------------------------------------------------
  // Between begin_capture() and end_capture() the ops issued are recorded, not run: they may not
  // allocate, wait for the device, or copy from or to pageable host memory (a device queue's
  // capture fails naming the call). begin_capture() returns false where there are no graphs (the
  // CPU; a device while profiling). abandon_capture() ends a capture an error interrupted.
  virtual bool begin_capture() { return false; }
  virtual int64_t end_capture() { throw Error("this backend has no graphs"); }
  virtual void abandon_capture() {}
  // Runs a captured graph; false (nothing run) when a buffer it holds the address of has moved
  // since its capture (buffer_moves() changed) or the queue is profiling.
  virtual bool replay(int64_t graph) {
    (void)graph;
    throw Error("this backend has no graphs");
  }
  virtual void release_graph(int64_t graph) { (void)graph; }
  // Moves so far of the backend buffers a graph may hold the address of (scratch growing,
  // descriptor tables starting over): ops during which it did not change find their buffers where
  // they are when run again, so they can be captured.
  virtual int64_t buffer_moves() const { return 0; }

  virtual QueueCounters counters() const { return {}; }
};

// The queue of a backend whose ops finish before they return.
class SynchronousQueue final : public WorkQueue {
 public:
  int64_t fence() override { return 0; }
  void wait(int64_t) override {}
  void wait_all() override {}
  void copy_to_host_later(void* host_dst, const void* src, int64_t bytes) override {
    std::memcpy(host_dst, src, static_cast<size_t>(bytes));
  }
};

}  // namespace multinorm
