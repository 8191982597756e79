// A stop asked of a running trainer: by a job scheduler (SLURM sends SIGTERM at a time limit or a
// preemption, then SIGKILL after a grace period; `sbatch --signal=USR1@120` sends SIGUSR1 ahead of
// it), or by a user (SIGINT, Ctrl-C). While a StopSignals lives, the first of SIGTERM, SIGINT or
// SIGUSR1 only sets a flag, which the trainer reads at the next update's boundary (with several
// ranks, the flags are summed in the update's first collective, so every rank stops after the same
// update): it finishes the update in flight, writes a checkpoint and exits with status 75
// (EX_TEMPFAIL: a job script requeues on it). A second SIGINT (Ctrl-C twice) ends the process at
// once, as the handler in place before would have; a second SIGTERM or SIGUSR1 changes nothing (a
// scheduler may deliver its stop twice: to every process of the job, and again through mpirun).
#pragma once

namespace multinorm {

// The exit status of a run stopped by a signal, its checkpoint written: resume it with --resume.
constexpr int kStoppedBySignalStatus = 75;

class StopSignals {
 public:
  StopSignals();   // installs the handlers
  ~StopSignals();  // restores the ones before
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  // The first stop signal received while one lives (0: none).
  static int received();
  // Its name: "SIGTERM", "SIGINT", "SIGUSR1".
  static const char* name(int signal);
};

}  // namespace multinorm
