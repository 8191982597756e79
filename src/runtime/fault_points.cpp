// Test-only kill points (include/multinorm/fault_points.h).
#include "multinorm/fault_points.h"

#include <csignal>
#include <cstdlib>
#include <cstring>

namespace multinorm {

void fault_point(const char* name) {
  static const char* wanted = std::getenv("MULTINORM_FAULT");
  if (wanted && std::strcmp(wanted, name) == 0) std::raise(SIGKILL);
}

}  // namespace multinorm
