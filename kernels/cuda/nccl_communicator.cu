// NCCL collectives over device memory, for data parallelism on GPUs. Each collective runs on the
// communicator's own stream, after an event recorded on the backend's compute stream when it was
// started: a bucket's all-reduce overlaps the backward kernels of the layers below it. wait_all()
// records a completion event, polls it together with ncclCommGetAsyncError and, past the timeout,
// aborts the communicator (ncclCommAbort) and throws naming the collective: a dead or stalled peer
// never leaves this rank waiting inside NCCL. The communicator is created non-blocking for the
// same reason (ncclCommInitRankConfig with blocking = 0, polled with the same deadline). A
// non-blocking call may return ncclInProgress before its work is on the stream (NCCL connects lazily
// on the first collectives): it is polled with ncclCommGetAsyncError until done before anything else
// touches the communicator or its stream, or the completion event could be recorded ahead of the
// collective. Any failure aborts the communicator at once, so its kernels stop spinning before a
// later cudaFree (which waits for the whole device) could hang on them.
#ifdef MULTINORM_HAVE_NCCL
// First: nccl.h brings the whole cuda_runtime.h, which the emulation's kernel macros (threadIdx,
// gridDim, ...) must not precede.
#include <nccl.h>
#endif

#include "nccl_communicator.h"

#include <chrono>
#include <cstring>
#include <exception>
#include <string>
#include <thread>

#include "check.h"
#include "cuda_queue.h"
#include "multinorm/error.h"

namespace multinorm::cuda {

#ifdef MULTINORM_HAVE_NCCL
namespace {

void nccl_check(ncclResult_t r, const std::string& what) {
  if (r != ncclSuccess && r != ncclInProgress)
    throw Error("NCCL: " + what + ": " + ncclGetErrorString(r) + " (code " + std::to_string(static_cast<int>(r)) + ")");
}

ncclDataType_t nccl_type(DType t) {
  if (t == DType::F32) return ncclFloat32;
  if (t == DType::BF16) return ncclBfloat16;
  if (t == DType::F64) return ncclFloat64;
  throw Error(std::string("NCCL: no collective over ") + dtype_name(t));
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(const std::vector<uint8_t>& id, int rank, int size, double timeout_s, CudaQueue& compute)
      : rank_(rank), size_(size), timeout_s_(timeout_s), queue_(compute), compute_(compute.stream()) {
    if (id.size() != sizeof(ncclUniqueId))
      throw Error("NCCL: the unique id has " + std::to_string(id.size()) + " bytes, expected " + std::to_string(sizeof(ncclUniqueId)));
    ncclUniqueId uid;
    std::memcpy(&uid, id.data(), sizeof(uid));
    MN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "creating the NCCL stream");
    MN_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), "creating the NCCL start event");
    MN_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "creating the NCCL completion event");
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    try {
      check(ncclCommInitRankConfig(&comm_, size, uid, rank, &config),
            "ncclCommInitRankConfig (rank " + std::to_string(rank) + " of " + std::to_string(size) + ")");
    } catch (...) {
      release();
      throw;
    }
  }
  ~NcclCommunicator() override {
    // A communicator with collectives in flight while the stack unwinds is aborted, not destroyed:
    // ncclCommDestroy would wait for them.
    if (comm_) (failed_ || !pending_.empty() || std::uncaught_exceptions() > 0 ? ncclCommAbort(comm_) : ncclCommDestroy(comm_));
    comm_ = nullptr;
    release();
  }
  std::string name() const override { return MN_EMULATED ? "NCCL (emulated over MPI)" : "NCCL"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce_sum(void* buf, int64_t n, DType t, const char* what) override {
    start(what);
    check(ncclAllReduce(buf, buf, static_cast<size_t>(n), nccl_type(t), ncclSum, comm_, stream_), what);
  }
  void reduce_sum(void* buf, int64_t n, DType t, int root, const char* what) override {
    start(what);
    check(ncclReduce(buf, buf, static_cast<size_t>(n), nccl_type(t), ncclSum, root, comm_, stream_), what);
  }
  void reduce_scatter_sum(const void* send, void* recv, int64_t n, DType t, const char* what) override {
    start(what);
    check(ncclReduceScatter(send, recv, static_cast<size_t>(n), nccl_type(t), ncclSum, comm_, stream_), what);
  }
  void all_gather(const void* send, void* recv, int64_t n, DType t, const char* what) override {
    start(what);
    check(ncclAllGather(send, recv, static_cast<size_t>(n), nccl_type(t), comm_, stream_), what);
  }
  void broadcast(void* buf, int64_t n, DType t, int root, const char* what) override {
    start(what);
    check(ncclBroadcast(buf, buf, static_cast<size_t>(n), nccl_type(t), root, comm_, stream_), what);
  }
  bool progress() override { return pending_.empty(); }  // NCCL progresses on its own
  // An event recorded on the NCCL stream after the collectives so far; the compute stream waits on it.
  int64_t mark() override {
    if (marks_used_ == marks_.size()) {
      cudaEvent_t e = nullptr;
      MN_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "creating an NCCL mark event");
      marks_.push_back(e);
    }
    MN_CUDA_CHECK(cudaEventRecord(marks_[marks_used_], stream_), "recording an NCCL mark");
    return static_cast<int64_t>(marks_used_++);
  }
  void after_mark(int64_t m) override {
    if (m < 0 || static_cast<size_t>(m) >= marks_used_) throw Error("NCCL: after_mark(" + std::to_string(m) + "): no such mark since the last wait_all");
    MN_CUDA_CHECK(cudaStreamWaitEvent(compute_, marks_[static_cast<size_t>(m)], 0), "ordering compute after a collective");
  }
  void wait_all() override {
    if (pending_.empty()) return;
    MN_CUDA_CHECK(cudaEventRecord(done_, stream_), "recording the NCCL completion event");
    const std::string what = pending_ + (count_ > 1 ? " (and " + std::to_string(count_ - 1) + " more)" : "");
    pending_.clear();
    count_ = 0;
    marks_used_ = 0;
    // The host waits for the collectives: counted with the backend's waits, and as a drain (the
    // compute stream has at most work that waits for them: it idles once they end, until the host
    // queues more).
    queue_.count_wait(true);
    poll(what, done_);
    // Later compute (the optimizer reading reduced gradients) is ordered after the collectives.
    MN_CUDA_CHECK(cudaStreamWaitEvent(compute_, done_, 0), "ordering compute after the collectives");
  }

 private:
  // Collectives start after everything issued on the compute stream so far.
  void start(const char* what) {
    MN_CUDA_CHECK(cudaEventRecord(ready_, compute_), "recording the NCCL start event");
    MN_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_, 0), "ordering a collective after compute");
    if (pending_.empty()) pending_ = what;
    ++count_;
  }
  // A call's result: ncclInProgress is waited out (the call is done when ncclCommGetAsyncError says
  // so); an error aborts the communicator and throws.
  void check(ncclResult_t r, const std::string& what) {
    if (r == ncclInProgress) return poll(what, nullptr);
    if (r != ncclSuccess) {
      abort_now();
      throw Error("NCCL: " + what + " failed on rank " + std::to_string(rank_) + ": " + ncclGetErrorString(r) + " (code " +
                  std::to_string(static_cast<int>(r)) + "); communicator aborted");
    }
  }
  void abort_now() {
    failed_ = true;
    if (comm_) ncclCommAbort(comm_);
    comm_ = nullptr;
  }
  void release() {
    for (cudaEvent_t e : marks_) cudaEventDestroy(e);
    marks_.clear();
    if (done_) cudaEventDestroy(done_);
    if (ready_) cudaEventDestroy(ready_);
    if (stream_) cudaStreamDestroy(stream_);
    done_ = ready_ = nullptr;
    stream_ = nullptr;
  }
  // Until `event` completes (or, without one, the last call is done: the pending initialisation or
  // an ncclInProgress collective), checking NCCL's asynchronous errors; an error or the timeout
  // aborts the communicator.
  void poll(const std::string& what, cudaEvent_t event) {
    using Clock = std::chrono::steady_clock;
    const auto t0 = Clock::now();
    for (;;) {
      ncclResult_t async = ncclSuccess;
      nccl_check(ncclCommGetAsyncError(comm_, &async), "ncclCommGetAsyncError");
      if (async != ncclSuccess && async != ncclInProgress) {
        abort_now();
        throw Error("NCCL: " + what + " failed on rank " + std::to_string(rank_) + ": " + ncclGetErrorString(async) + "; communicator aborted");
      }
      if (!event && async == ncclSuccess) return;
      if (event) {
        const cudaError_t q = cudaEventQuery(event);
        if (q == cudaSuccess) return;
        if (q != cudaErrorNotReady) MN_CUDA_CHECK(q, "waiting for " + what);
      }
      const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
      if (waited > timeout_s_) {
        abort_now();
        throw Error("NCCL: rank " + std::to_string(rank_) + ": " + what + " did not complete within " +
                    std::to_string(static_cast<int64_t>(timeout_s_)) +
                    " s (parallel.timeout_s): another rank is dead, stalled or took another path; communicator aborted");
      }
      if (waited > 0.01) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  int rank_, size_;
  double timeout_s_;
  CudaQueue& queue_;  // the backend's: its host waits are counted there
  cudaStream_t compute_, stream_ = nullptr;
  cudaEvent_t ready_ = nullptr, done_ = nullptr;
  ncclComm_t comm_ = nullptr;
  std::string pending_;  // the first collective started since the last wait_all()
  int count_ = 0;
  std::vector<cudaEvent_t> marks_;  // mark() events, reused: the first marks_used_ are recorded since the last wait_all
  size_t marks_used_ = 0;
  bool failed_ = false;
};

}  // namespace

std::vector<uint8_t> nccl_unique_id() {
  ncclUniqueId id;
  nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  std::vector<uint8_t> bytes(sizeof(id));
  std::memcpy(bytes.data(), &id, sizeof(id));
  return bytes;
}

std::unique_ptr<Communicator> make_nccl_communicator(const std::vector<uint8_t>& id, int rank, int size, double timeout_s,
                                                     CudaQueue& compute) {
  return std::make_unique<NcclCommunicator>(id, rank, size, timeout_s, compute);
}

#else  // a plugin built without NCCL: one GPU per run

namespace {
[[noreturn]] void no_nccl() {
  throw Error("this CUDA plugin was built without NCCL (nccl.h and libnccl were not found): it cannot run on several GPUs");
}
}  // namespace
std::vector<uint8_t> nccl_unique_id() { no_nccl(); }
std::unique_ptr<Communicator> make_nccl_communicator(const std::vector<uint8_t>&, int, int, double, CudaQueue&) { no_nccl(); }

#endif

}  // namespace multinorm::cuda
