// Data-parallel communication between the ranks of one run. Launched by `mpirun -np N multinorm ...`
// (an MPI build), the ranks are MPI's world; otherwise there is one rank and every collective is the
// identity. Collectives are blocking and called by every rank in the same order (the trainer's loop
// is identical on all ranks), so their results are identical on every rank.
#pragma once
#include <cstdint>
#include <string>

namespace multinorm {

// The world size a launcher announced in the environment (Open MPI, MPICH/Intel MPI's PMI, MVAPICH,
// Slurm's srun), or {"", 0} when none did. The communicator refuses to start when it cannot be that
// many ranks (a build without MPI, or another MPI's launcher), instead of running N lone rank 0s.
struct LauncherWorld {
  std::string variable;
  int size = 0;
};
LauncherWorld launcher_world();

class Comm {
 public:
  // The run's communicator. MPI is initialised on first use when the process was started by an MPI
  // launcher (and finalised at exit); a process started alone never touches MPI.
  static Comm& world();
  // True once world() has joined a run of more than one rank (never initialises MPI itself).
  static bool several_ranks();
  int rank() const { return rank_; }
  int size() const { return size_; }
  bool root() const { return rank_ == 0; }
  // In place, element-wise sums over the ranks.
  void allreduce_sum(float* x, int64_t n);
  void allreduce_sum(double* x, int64_t n);
  void allreduce_sum(int64_t* x, int64_t n);
  void broadcast(void* data, int64_t bytes, int root = 0);
  void barrier();
  // Ends every rank of the run at once (an error on one rank would otherwise leave the others
  // waiting in a collective). Returns only when there is a single rank.
  void abort_all(int code);

 private:
  Comm();
  int rank_ = 0, size_ = 1;
};

// "MPI, rank r of n" or "single process": for logs.
const char* comm_description();

}  // namespace multinorm
