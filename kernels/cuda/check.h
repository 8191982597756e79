// Checking every CUDA runtime and cuBLASLt call: a failure throws multinorm::Error naming the call,
// what the backend was doing (op and shapes) and the error.
#pragma once
#include <cublasLt.h>

#include <deque>
#include <string>
#include <vector>

#include "cuda_compat.h"
#include "ring_spans.h"

namespace multinorm::cuda {

[[noreturn]] void throw_cublas_error(const std::string& what, cublasStatus_t s);
// The host waits for everything queued on `stream` (checked; `what` names the wait in an error).
// Every such wait of the backend goes through here and is counted: host_waits() is what
// Backend::host_synchronisations() reports, and the tests bound it per micro-batch and per update.
// (Debug builds' synchronisation after each launch, a diagnostic mode, is not counted.)
// A wait also delivers the copies queue_copy_to_host() queued on that stream.
void wait_for_stream(cudaStream_t stream, const std::string& what);
int64_t host_waits();
// Work issued to the device so far (kernel launches, cuBLASLt calls, copies, graph launches): a fence
// remembers the count, so that waiting for it can tell whether the device had work left after it.
void note_work_issued();
int64_t work_issued();
// The copies queue_copy_to_host() has issued so far: a fence remembers the count too.
uint64_t queued_copies_issued();
// The host waits for `event` (recorded on `stream` when work_issued() was work_at_record and
// queued_copies_issued() copies_before), then delivers the queued copies issued before it. Counted
// by host_waits(); by host_drains() too when no work was issued after the event. The work issued
// after it keeps the device busy meanwhile.
void wait_for_event(cudaEvent_t event, cudaStream_t stream, uint64_t copies_before, int64_t work_at_record, const std::string& what);
// The waits after which the device had nothing queued (every wait_for_stream, and event waits with
// no work after the event): each leaves the GPU idle until the host issues more.
int64_t host_drains();
// wait_for_stream calls on `stream` so far (a fence recorded before the latest one is finished).
int64_t stream_waits(cudaStream_t stream);
// A device-to-host copy queued on `stream` without waiting: the bytes go by cudaMemcpyAsync into
// pinned staging (pageable memory would make the copy synchronous) and reach `host_dst` when the
// host next waits for the stream (wait_for_stream). host_dst must stay valid until then; until
// then it keeps its old bytes. The staging grows on first use and is reused once delivered.
void queue_copy_to_host(void* host_dst, const void* device_src, int64_t bytes, cudaStream_t stream);
// Host-to-device copies staged in a pinned ring (kPinnedUploadBytes, allocated on first use), one per
// stream: a cudaMemcpyAsync from pageable memory may make the driver wait for the stream before it
// stages the bytes (the CUDA runtime's notes on API synchronisation), stalling the host behind every
// queued kernel. upload() copies the bytes into the ring (the caller may reuse host_src when it
// returns), queues the device copy from there and records an event after it; the ring's bytes are
// written again once that event has passed; the host waits for it (counted) only when it has run a
// whole ring ahead of the device. At most a quarter of the ring per copy. Not while the stream
// captures a graph (a replay would copy whatever the ring holds then).
constexpr int64_t kPinnedUploadBytes = 8ll << 20;
class UploadRing {
 public:
  explicit UploadRing(cudaStream_t stream);
  ~UploadRing();
  void upload(void* device_dst, const void* host_src, int64_t bytes, const std::string& what);

 private:
  void give_back_oldest(bool wait, const std::string& what);
  struct InFlight {
    cudaEvent_t done;
    int64_t work;  // work_issued() after its copy
  };
  cudaStream_t stream_;
  char* ring_ = nullptr;
  RingSpans spans_;
  std::deque<InFlight> in_flight_;  // oldest first, one per span of spans_
  std::vector<cudaEvent_t> spare_;
};
// A host wait that does not go through the functions above (NCCL's completion poll): counted as one,
// and as a drain when `drain`.
void count_host_wait(bool drain);
// Copies queued on `stream` and not yet delivered.
int64_t queued_copies(cudaStream_t stream);
// For a stream about to be destroyed: waits for it (not counted, errors ignored) and drops its
// undelivered copies, whose destinations may be gone.
void discard_queued_copies(cudaStream_t stream);

}  // namespace multinorm::cuda

#define MN_CUDA_CHECK(call, what)                                                                  \
  do {                                                                                             \
    const cudaError_t mn_e_ = (call);                                                              \
    if (mn_e_ != cudaSuccess) ::multinorm::cuda::throw_cuda_error(std::string(#call) + " in " + (what), mn_e_); \
  } while (0)
#define MN_CUBLAS_CHECK(call, what)                                                                \
  do {                                                                                             \
    const cublasStatus_t mn_s_ = (call);                                                           \
    if (mn_s_ != CUBLAS_STATUS_SUCCESS) ::multinorm::cuda::throw_cublas_error(std::string(#call) + " in " + (what), mn_s_); \
  } while (0)
