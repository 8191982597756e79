#include "multinorm/comm.h"

#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>

#include "multinorm/error.h"

#ifdef MULTINORM_HAVE_MPI
#include <mpi.h>
#ifdef OPEN_MPI
#define MPI_VERSION_TEXT "Open MPI"
#else
#define MPI_VERSION_TEXT "not Open MPI"
#endif
#endif

namespace multinorm {

namespace {

bool launched_by_mpi() { return !launcher_world().variable.empty() || std::getenv("PMIX_RANK"); }

#ifdef MULTINORM_HAVE_MPI
void check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    throw Error(std::string("MPI: ") + what + ": " + std::string(msg, static_cast<size_t>(len)));
  }
}

// Large buffers go in pieces: MPI counts are int.
template <class F>
void in_pieces(int64_t n, F&& f) {
  constexpr int64_t kPiece = int64_t{1} << 30;
  for (int64_t at = 0; at < n; at += kPiece) f(at, static_cast<int>(std::min(kPiece, n - at)));
}

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
#endif

// In place, over MPI_COMM_WORLD; nothing to do for a single rank.
template <class T>
void sum_over_ranks(T* x, int64_t n, int ranks) {
  if (ranks == 1) return;
#ifdef MULTINORM_HAVE_MPI
  in_pieces(n, [&](int64_t at, int count) {
    check(MPI_Allreduce(MPI_IN_PLACE, x + at, count, mpi_type<T>(), MPI_SUM, MPI_COMM_WORLD), "MPI_Allreduce");
  });
#else
  (void)x, (void)n;
#endif
}

}  // namespace

LauncherWorld launcher_world() {
  // Open MPI's mpirun, MPICH/Intel MPI's Hydra (PMI), MVAPICH, Slurm's srun (a step of several tasks).
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE", "SLURM_STEP_NUM_TASKS", "MPI_LOCALNRANKS"})
    if (const char* s = std::getenv(v)) {
      const int n = std::atoi(s);
      if (n >= 1) return {v, n};
    }
  return {};
}

Comm::Comm() {
  const LauncherWorld launcher = launcher_world();
  if (!launched_by_mpi()) return;
#ifdef MULTINORM_HAVE_MPI
  int provided = 0;
  // The loader's prefetch thread and OpenMP never call MPI: only the main thread does.
  check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
  std::atexit(finalize_at_exit);
  check(MPI_Comm_rank(MPI_COMM_WORLD, &rank_), "MPI_Comm_rank");
  check(MPI_Comm_size(MPI_COMM_WORLD, &size_), "MPI_Comm_size");
  // A launcher of another MPI (e.g. MPICH's mpiexec for an Open MPI build) starts N singletons, each
  // "rank 0 of 1", that would all write the same run directory.
  if (launcher.size > 1 && size_ != launcher.size)
    throw Error("the launcher says " + std::to_string(launcher.size) + " ranks (" + launcher.variable + "), but MPI sees " +
                std::to_string(size_) + ": launched with another MPI than the one multinorm was built with? Use that "
                "MPI's mpirun (this build: " + MPI_VERSION_TEXT + ")");
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

void Comm::allreduce_sum(float* x, int64_t n) { sum_over_ranks(x, n, size_); }
void Comm::allreduce_sum(double* x, int64_t n) { sum_over_ranks(x, n, size_); }
void Comm::allreduce_sum(int64_t* x, int64_t n) { sum_over_ranks(x, n, size_); }

void Comm::broadcast(void* data, int64_t bytes, int root) {
  if (size_ == 1) return;
#ifdef MULTINORM_HAVE_MPI
  in_pieces(bytes, [&](int64_t at, int count) {
    check(MPI_Bcast(static_cast<char*>(data) + at, count, MPI_BYTE, root, MPI_COMM_WORLD), "MPI_Bcast");
  });
#else
  (void)data, (void)bytes, (void)root;
#endif
}

void Comm::barrier() {
  if (size_ == 1) return;
#ifdef MULTINORM_HAVE_MPI
  check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
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
