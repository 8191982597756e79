// The run directory's lock (include/multinorm/run_lock.h).
#include "multinorm/run_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <string>

#include "multinorm/error.h"

namespace multinorm {

RunDirLock::RunDirLock(const std::string& run_dir) {
  const std::string path = run_dir + "/.lock";
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw Error(path + ": cannot open the run directory's lock: " + std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char holder[256] = {0};
    const ssize_t n = ::pread(fd_, holder, sizeof(holder) - 1, 0);
    ::close(fd_);
    fd_ = -1;
    if (err != EWOULDBLOCK) throw Error(path + ": cannot lock the run directory: " + std::strerror(err));
    std::string who = n > 0 ? std::string(holder, static_cast<size_t>(n)) : "an unknown process";
    while (!who.empty() && who.back() == '\n') who.pop_back();
    throw Error(run_dir + " is in use by another trainer (" + who + "; lock " + path +
                "): wait for it to end, or use another output_dir");
  }
  char host[256] = "unknown";
  ::gethostname(host, sizeof(host) - 1);
  char when[64] = "";
  const std::time_t now = std::time(nullptr);
  std::strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S UTC", std::gmtime(&now));
  const std::string me = "pid " + std::to_string(::getpid()) + " on " + host + ", since " + when + "\n";
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, me.data(), me.size(), 0) != static_cast<ssize_t>(me.size()))
    throw Error(path + ": cannot record the lock's holder: " + std::strerror(errno));
}

RunDirLock::~RunDirLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock; the file stays (its content names the last holder)
}

}  // namespace multinorm
