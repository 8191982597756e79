// One trainer per run directory: an advisory lock (flock) on <run>/.lock, held for the run's life
// and released by the kernel when the process ends, however it ends. A second `train` on the same
// directory fails at once, naming the holder's pid, host and start time. With MPI, rank 0 holds it.
#pragma once
#include <string>

namespace multinorm {

class RunDirLock {
 public:
  // Takes the lock or throws Error naming the holder.
  explicit RunDirLock(const std::string& run_dir);
  ~RunDirLock();
  RunDirLock(const RunDirLock&) = delete;
  RunDirLock& operator=(const RunDirLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace multinorm
