// The Communicator over MPI and host memory (the CPU backend): non-blocking MPI collectives on a
// duplicate of MPI_COMM_WORLD, moved on by progress() calls between the backward pass's layers
// (Open MPI progresses non-blocking collectives inside MPI calls only) and completed by wait_all()
// with the run's timeout.
#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "mpi_util.h"
#include "multinorm/comm.h"
#include "multinorm/communicator.h"
#include "multinorm/data_parallel.h"
#include "multinorm/error.h"

namespace multinorm {

namespace {

#ifdef MULTINORM_HAVE_MPI
class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(Comm& comm) : comm_(comm) {
    mpi::check(MPI_Comm_dup(MPI_COMM_WORLD, &mc_), "MPI_Comm_dup (gradient communicator)");
    MPI_Comm_set_errhandler(mc_, MPI_ERRORS_RETURN);
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && reqs_.empty()) MPI_Comm_free(&mc_);
  }
  std::string name() const override { return "MPI"; }
  int rank() const override { return comm_.rank(); }
  int size() const override { return comm_.size(); }

  void all_reduce_sum(void* buf, int64_t n, DType t, const char* what) override {
    pieces(buf, n, t, what, [&](char* p, int c) {
      return MPI_Iallreduce(MPI_IN_PLACE, p, c, mpi::datatype(t), mpi::sum_op(t), mc_, add(what));
    });
  }
  void reduce_sum(void* buf, int64_t n, DType t, int root, const char* what) override {
    const bool me = root == comm_.rank();
    pieces(buf, n, t, what, [&](char* p, int c) {
      return MPI_Ireduce(me ? MPI_IN_PLACE : p, me ? p : nullptr, c, mpi::datatype(t), mpi::sum_op(t), root, mc_, add(what));
    });
  }
  void reduce_scatter_sum(const void* send, void* recv, int64_t n, DType t, const char* what) override {
    if (n > mpi::kPiece) throw Error(std::string(what) + ": reduce-scatter of more than 2^30 elements per rank");
    check(MPI_Ireduce_scatter_block(send, recv, static_cast<int>(n), mpi::datatype(t), mpi::sum_op(t), mc_, add(what)), what);
  }
  void all_gather(const void* send, void* recv, int64_t n, DType t, const char* what) override {
    if (n > mpi::kPiece) throw Error(std::string(what) + ": all-gather of more than 2^30 elements per rank");
    const bool in_place = send == static_cast<const char*>(recv) + comm_.rank() * n * dtype_bytes(t);
    check(MPI_Iallgather(in_place ? MPI_IN_PLACE : send, static_cast<int>(n), mpi::datatype(t), recv, static_cast<int>(n),
                         mpi::datatype(t), mc_, add(what)),
          what);
  }
  void broadcast(void* buf, int64_t n, DType t, int root, const char* what) override {
    pieces(buf, n, t, what, [&](char* p, int c) { return MPI_Ibcast(p, c, mpi::datatype(t), root, mc_, add(what)); });
  }
  bool progress() override {
    if (reqs_.empty()) return true;
    int done = 0;
    check(MPI_Testall(static_cast<int>(reqs_.size()), reqs_.data(), &done, MPI_STATUSES_IGNORE), whats_.front());
    if (done) completed_ += static_cast<int64_t>(reqs_.size()), reqs_.clear(), whats_.clear();
    return done != 0;
  }
  void wait_all() override {
    if (reqs_.empty()) return;
    const std::string what = whats_.front() + (reqs_.size() > 1 ? " (and " + std::to_string(reqs_.size() - 1) + " more)" : "");
    whats_.clear();
    completed_ += static_cast<int64_t>(reqs_.size());
    mpi::wait_all(reqs_, comm_.timeout(), what);
  }
  // Marks count requests: the requests started before a mark are the first (mark - completed_) pending.
  int64_t mark() override { return completed_ + static_cast<int64_t>(reqs_.size()); }
  void after_mark(int64_t m) override {
    const int64_t k = std::min<int64_t>(m - completed_, static_cast<int64_t>(reqs_.size()));
    if (k <= 0) return;
    // Waited on a copy of the handles; they leave reqs_ only once complete, so a timeout (which
    // throws) leaves them tracked and the destructor does not free the communicator under them.
    std::vector<MPI_Request> first(reqs_.begin(), reqs_.begin() + k);
    const std::string what = whats_.front() + (k > 1 ? " (and " + std::to_string(k - 1) + " more)" : "");
    mpi::wait_all(first, comm_.timeout(), what);
    reqs_.erase(reqs_.begin(), reqs_.begin() + k);
    whats_.erase(whats_.begin(), whats_.begin() + k);
    completed_ += k;
  }

 private:
  MPI_Request* add(const char* what) {
    whats_.push_back(what);
    reqs_.push_back(MPI_REQUEST_NULL);
    return &reqs_.back();
  }
  void check(int rc, const std::string& what) {
    if (rc != MPI_SUCCESS) {
      reqs_.clear(), whats_.clear();
      mpi::check(rc, what);
    }
  }
  // A collective of more than 2^30 elements starts as several (MPI counts are int).
  template <class Start>
  void pieces(void* buf, int64_t n, DType t, const char* what, Start&& start) {
    for (int64_t at = 0; at < n; at += mpi::kPiece)
      check(start(static_cast<char*>(buf) + at * dtype_bytes(t), static_cast<int>(std::min(mpi::kPiece, n - at))), what);
  }

  Comm& comm_;
  MPI_Comm mc_ = MPI_COMM_NULL;
  std::vector<MPI_Request> reqs_;
  std::vector<std::string> whats_;
  int64_t completed_ = 0;  // requests started and completed before reqs_[0]
};
#endif

// One rank: every collective is the identity (a copy where source and destination differ).
class SingleRankCommunicator final : public Communicator {
 public:
  std::string name() const override { return "single process"; }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void all_reduce_sum(void*, int64_t, DType, const char*) override {}
  void reduce_sum(void*, int64_t, DType, int, const char*) override {}
  void reduce_scatter_sum(const void* send, void* recv, int64_t n, DType t, const char*) override {
    if (send != recv) std::memmove(recv, send, static_cast<size_t>(n * dtype_bytes(t)));
  }
  void all_gather(const void* send, void* recv, int64_t n, DType t, const char*) override {
    if (send != recv) std::memmove(recv, send, static_cast<size_t>(n * dtype_bytes(t)));
  }
  void broadcast(void*, int64_t, DType, int, const char*) override {}
  bool progress() override { return true; }
  void wait_all() override {}
  int64_t mark() override { return 0; }
  void after_mark(int64_t) override {}
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(Comm& comm) {
#ifdef MULTINORM_HAVE_MPI
  if (comm.size() > 1) return std::make_unique<MpiCommunicator>(comm);
#endif
  (void)comm;
  return std::make_unique<SingleRankCommunicator>();
}

}  // namespace multinorm
