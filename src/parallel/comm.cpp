#include "multinorm/comm.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "../../kernels/common/bf16.h"
#include "mpi_util.h"
#include "multinorm/error.h"

#ifdef MULTINORM_HAVE_MPI
#ifdef OPEN_MPI
#define MPI_VERSION_TEXT "Open MPI"
#else
#define MPI_VERSION_TEXT "not Open MPI"
#endif
#endif

namespace multinorm {

namespace {

bool launched_by_mpi() { return !launcher_world().variable.empty() || std::getenv("PMIX_RANK"); }

// What the rank is doing, in a fixed buffer the termination handler can write without allocating.
char g_activity[160] = "starting";
char g_rank_text[32] = "";
// Once this rank has done its work and chosen its exit status (Comm::exiting_with), -1 until then.
volatile sig_atomic_t g_exit_status = -1;

// The launcher (mpirun, srun) terminates the surviving ranks when one fails or dies: each says
// which rank it is and where it was, so the log shows every rank's last update.
void on_terminate(int sig) {
  // Done already: the launcher ends the job because a rank that finished first exited non-zero (75
  // after a stop): this rank's own status, and nothing to report.
  if (g_exit_status >= 0) ::_exit(g_exit_status);
  char line[320];
  const int n = std::snprintf(line, sizeof(line),
                              "multinorm: rank %s: terminated by signal %d during %s (the launcher ended the run: another "
                              "rank failed or died, see above)\n",
                              g_rank_text, sig, g_activity);
  if (n > 0) {
    const ssize_t w = ::write(STDERR_FILENO, line, static_cast<size_t>(std::min<int>(n, sizeof(line) - 1)));
    (void)w;
  }
  ::_exit(128 + sig);
}

#ifdef MULTINORM_HAVE_MPI
template <class T>
MPI_Datatype mpi_type() {
  if constexpr (std::is_same_v<T, float>) return MPI_FLOAT;
  else if constexpr (std::is_same_v<T, double>) return MPI_DOUBLE;
  else return MPI_INT64_T;
}

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

// In place over MPI_COMM_WORLD, non-blocking in pieces, completed with the deadline.
template <class T>
void reduce_over_ranks(T* x, int64_t n, MPI_Op op, double timeout, const char* what) {
  std::vector<MPI_Request> reqs;
  for (int64_t at = 0; at < n; at += mpi::kPiece) {
    reqs.emplace_back();
    mpi::check(MPI_Iallreduce(MPI_IN_PLACE, x + at, static_cast<int>(std::min(mpi::kPiece, n - at)), mpi_type<T>(), op,
                              MPI_COMM_WORLD, &reqs.back()),
               what);
  }
  mpi::wait_all(reqs, timeout, what);
}
#endif

}  // namespace

#ifdef MULTINORM_HAVE_MPI
namespace mpi {

void check(int rc, const std::string& what) {
  if (rc != MPI_SUCCESS) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    throw Error("MPI: " + what + ": " + std::string(msg, static_cast<size_t>(len)));
  }
}

namespace {
void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  bf16_sum_into(static_cast<const bf16*>(in), static_cast<bf16*>(inout), *len);
}
}  // namespace

MPI_Datatype datatype(DType t) { return t == DType::F32 ? MPI_FLOAT : t == DType::F64 ? MPI_DOUBLE : MPI_UINT16_T; }

MPI_Op sum_op(DType t) {
  if (t != DType::BF16) return MPI_SUM;
  static MPI_Op op = [] {
    MPI_Op o;
    check(MPI_Op_create(&bf16_sum, 1, &o), "MPI_Op_create (BF16 sum)");
    return o;
  }();
  return op;
}

void wait_all(std::vector<MPI_Request>& requests, double timeout_s, const std::string& what) {
  if (requests.empty()) return;
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  for (int64_t polls = 0;; ++polls) {
    int done = 0;
    check(MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE), what);
    if (done) break;
    const double waited = std::chrono::duration<double>(Clock::now() - start).count();
    if (waited > timeout_s)
      throw Error("rank " + std::string(g_rank_text) + ": " + what + " during " + g_activity + " did not complete within " +
                  std::to_string(static_cast<int64_t>(timeout_s)) +
                  " s (parallel.timeout_s): another rank is dead, stalled or took another path");
    // Busy polling drives Open MPI's non-blocking collectives (they progress inside MPI calls
    // only); a wait longer than a second is a slow peer, not a transfer: back off to sleeps.
    if (waited > 1.0) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  requests.clear();
}

}  // namespace mpi
#endif

LauncherWorld launcher_world() {
  // Open MPI's mpirun, MPICH/Intel MPI's Hydra (PMI), MVAPICH, Slurm's srun (a step of several tasks).
  LauncherWorld w;
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE", "SLURM_STEP_NUM_TASKS", "MPI_LOCALNRANKS"})
    if (const char* s = std::getenv(v)) {
      const int n = std::atoi(s);
      if (n >= 1) {
        w = {v, n, 0};
        break;
      }
    }
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "MV2_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"})
    if (const char* s = std::getenv(v)) {
      w.local_rank = std::max(0, std::atoi(s));
      break;
    }
  return w;
}

Comm::Comm() {
  const LauncherWorld launcher = launcher_world();
  if (!launched_by_mpi()) return;
#ifdef MULTINORM_HAVE_MPI
  int provided = 0;
  // The loader's prefetch thread and OpenMP never call MPI: only the main thread does.
  mpi::check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
  std::atexit(finalize_at_exit);
  // Errors come back as codes (thrown as Error, then every rank is ended by abort_all) instead of
  // aborting inside MPI without saying where.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  mpi::check(MPI_Comm_rank(MPI_COMM_WORLD, &rank_), "MPI_Comm_rank");
  mpi::check(MPI_Comm_size(MPI_COMM_WORLD, &size_), "MPI_Comm_size");
  std::snprintf(g_rank_text, sizeof(g_rank_text), "%d of %d", rank_, size_);
  // A launcher of another MPI (e.g. MPICH's mpiexec for an Open MPI build) starts N singletons, each
  // "rank 0 of 1", that would all write the same run directory.
  if (launcher.size > 1 && size_ != launcher.size)
    throw Error("the launcher says " + std::to_string(launcher.size) + " ranks (" + launcher.variable + "), but MPI sees " +
                std::to_string(size_) + ": launched with another MPI than the one multinorm was built with? Use that "
                "MPI's mpirun (this build: " + MPI_VERSION_TEXT + ")");
  if (size_ > 1) {
    struct sigaction sa {};
    sa.sa_handler = on_terminate;
    ::sigaction(SIGTERM, &sa, nullptr);
    ::sigaction(SIGINT, &sa, nullptr);
  }
#else
  if (launcher.size > 1)
    throw Error("started as one of " + std::to_string(launcher.size) + " ranks (" + launcher.variable +
                "), but this multinorm was built without MPI: every process would train alone as rank 0 and write "
                "the same run directory. Install libopenmpi-dev and rebuild with -DMULTINORM_WITH_MPI=ON");
#endif
}

namespace {
bool g_several_ranks = false;
}

Comm& Comm::world() {
  static Comm comm;
  g_several_ranks = comm.size() > 1;
  return comm;
}

bool Comm::several_ranks() { return g_several_ranks; }

void Comm::exiting_with(int status) { g_exit_status = status; }

void Comm::set_activity(const std::string& what) {
  std::snprintf(g_activity, sizeof(g_activity), "%s", what.c_str());
}
std::string Comm::activity() { return g_activity; }
const char* Comm::rank_text_for_handler() { return g_rank_text; }
const char* Comm::activity_for_handler() { return g_activity; }

#ifdef MULTINORM_HAVE_MPI
#define MN_REDUCE(T, op, what) \
  if (size_ > 1) reduce_over_ranks<T>(x, n, op, timeout_s_, what)
#else
#define MN_REDUCE(T, op, what) (void)x, (void)n
#endif

void Comm::allreduce_sum(float* x, int64_t n) { MN_REDUCE(float, MPI_SUM, "MPI_Iallreduce (sum of floats)"); }
void Comm::allreduce_sum(double* x, int64_t n) { MN_REDUCE(double, MPI_SUM, "MPI_Iallreduce (sum of doubles)"); }
void Comm::allreduce_sum(int64_t* x, int64_t n) { MN_REDUCE(int64_t, MPI_SUM, "MPI_Iallreduce (sum of integers)"); }
void Comm::allreduce_max(double* x, int64_t n) { MN_REDUCE(double, MPI_MAX, "MPI_Iallreduce (maximum)"); }
#undef MN_REDUCE

void Comm::broadcast(void* data, int64_t bytes, int root) {
  if (size_ == 1) return;
#ifdef MULTINORM_HAVE_MPI
  std::vector<MPI_Request> reqs;
  for (int64_t at = 0; at < bytes; at += mpi::kPiece) {
    reqs.emplace_back();
    mpi::check(MPI_Ibcast(static_cast<char*>(data) + at, static_cast<int>(std::min(mpi::kPiece, bytes - at)), MPI_BYTE, root,
                          MPI_COMM_WORLD, &reqs.back()),
               "MPI_Ibcast");
  }
  mpi::wait_all(reqs, timeout_s_, "MPI_Ibcast from rank " + std::to_string(root));
#else
  (void)data, (void)bytes, (void)root;
#endif
}

// Point to point in pieces (MPI counts are int), completed with the deadline.
void Comm::send(const void* data, int64_t bytes, int to) { point_to_point(const_cast<void*>(data), bytes, to, true); }
void Comm::recv(void* data, int64_t bytes, int from) { point_to_point(data, bytes, from, false); }

void Comm::point_to_point(void* data, int64_t bytes, int peer, bool sending) {
#ifdef MULTINORM_HAVE_MPI
  const std::string what = sending ? "MPI_Isend to rank " + std::to_string(peer) : "MPI_Irecv from rank " + std::to_string(peer);
  std::vector<MPI_Request> reqs;
  for (int64_t at = 0; at < bytes; at += mpi::kPiece) {
    reqs.emplace_back();
    char* p = static_cast<char*>(data) + at;
    const int count = static_cast<int>(std::min(mpi::kPiece, bytes - at));
    mpi::check(sending ? MPI_Isend(p, count, MPI_BYTE, peer, 7, MPI_COMM_WORLD, &reqs.back())
                       : MPI_Irecv(p, count, MPI_BYTE, peer, 7, MPI_COMM_WORLD, &reqs.back()),
               what);
  }
  mpi::wait_all(reqs, timeout_s_, what);
#else
  (void)data, (void)bytes, (void)peer, (void)sending;
  throw Error("Comm: point-to-point in a build without MPI (one rank)");
#endif
}

void Comm::barrier() {
  if (size_ == 1) return;
#ifdef MULTINORM_HAVE_MPI
  std::vector<MPI_Request> reqs(1);
  mpi::check(MPI_Ibarrier(MPI_COMM_WORLD, &reqs[0]), "MPI_Ibarrier");
  mpi::wait_all(reqs, timeout_s_, "MPI_Ibarrier");
#endif
}

void Comm::abort_all(int code) {
  if (size_ == 1) return;
#ifdef MULTINORM_HAVE_MPI
  MPI_Abort(MPI_COMM_WORLD, code);
#endif
  std::exit(code);
}

const char* comm_description() {
  static std::string s;
  const Comm& c = Comm::world();
  s = c.size() == 1 ? "single process" : "MPI, rank " + std::to_string(c.rank()) + " of " + std::to_string(c.size());
  return s.c_str();
}

}  // namespace multinorm
