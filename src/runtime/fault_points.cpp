// Test-only kill and delay points (include/multinorm/fault_points.h).
#include "multinorm/fault_points.h"

#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <cstring>

namespace multinorm {

void fault_point(const char* name) {
  static const char* wanted = std::getenv("MULTINORM_FAULT");
  static const char* delayed = std::getenv("MULTINORM_DELAY");
  if (wanted && std::strcmp(wanted, name) == 0) std::raise(SIGKILL);
  if (delayed && std::strcmp(delayed, name) == 0) ::sleep(2);
}

}  // namespace multinorm
