// Named points where a test may kill the process (SIGKILL, as a crash or an OOM kill would): with
// MULTINORM_FAULT=<name>, the first time the process reaches point <name> it dies there; with
// MULTINORM_DELAY=<name> it waits 2 s there each time (to force one order of a race). For the
// fault-injection tests (tests/faults.sh, tests/preemption.sh) only; a no-op otherwise.
#pragma once

namespace multinorm {

void fault_point(const char* name);

}  // namespace multinorm
