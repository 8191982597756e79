// The run's host communicator: launched by `mpirun -np N multinorm ...` (an MPI build), the ranks
// are MPI's world; otherwise there is one rank and every collective is the identity. It carries the
// small host-side collectives of the trainer (loss sums, token counts, the gradient norm's partials,
// checkpoint gathers) and bootstraps NCCL; gradients and weights go through a Communicator
// (communicator.h). Collectives are called by every rank in the same order; none waits forever:
// past the timeout (parallel.timeout_s) an Error names the collective, the rank and the update.
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
  int local_rank = 0;  // this process's rank on its node (GPU selection)
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
  // Seconds a collective may wait for the other ranks before the run is ended (default 600).
  void set_timeout(double seconds) { timeout_s_ = seconds; }
  double timeout() const { return timeout_s_; }
  // What this rank is doing ("update 12"): named by timeout errors, and printed when the launcher
  // terminates the rank because another one failed.
  static void set_activity(const std::string& what);
  static std::string activity();
  // For a signal handler (no allocation): this rank ("0 of 2"; "" without MPI) and its activity.
  static const char* rank_text_for_handler();
  static const char* activity_for_handler();
  // This rank's work is done and it exits with STATUS: when the launcher terminates it from here on
  // (mpirun ends a job once one rank exits non-zero, as every rank does after a stop), it exits with
  // STATUS without reporting a failure.
  static void exiting_with(int status);
  // In place, element-wise sums (or maxima) over the ranks.
  void allreduce_sum(float* x, int64_t n);
  void allreduce_sum(double* x, int64_t n);
  void allreduce_sum(int64_t* x, int64_t n);
  void allreduce_max(double* x, int64_t n);
  void broadcast(void* data, int64_t bytes, int root = 0);
  // Point to point, for gathering a sharded optimizer state on rank 0.
  void send(const void* data, int64_t bytes, int to);
  void recv(void* data, int64_t bytes, int from);
  void barrier();
  // Ends every rank of the run at once (an error on one rank would otherwise leave the others
  // waiting in a collective). Returns only when there is a single rank.
  void abort_all(int code);

 private:
  Comm();
  void point_to_point(void* data, int64_t bytes, int peer, bool sending);
  int rank_ = 0, size_ = 1;
  double timeout_s_ = 600;
};

// "MPI, rank r of n" or "single process": for logs.
const char* comm_description();

}  // namespace multinorm
