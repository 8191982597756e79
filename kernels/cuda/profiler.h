// Time per kernel on the device, from CUDA events around every launch and cuBLASLt call while
// profiling is on (Backend::set_profiling): what `multinorm doctor` and `bench model --backend cuda`
// print. Off by default; when off a launch pays one branch. In the emulated build the events hold the
// host's clock at the (synchronous) launch, so the times are the emulation's, not a GPU's.
#pragma once
#include <string>
#include <vector>

#include "cuda_compat.h"
#include "multinorm/backend.h"

namespace multinorm::cuda::profiler {

// g_on, begin(name, stream) and end(stream) (an event pair around one launch) are declared in
// cuda_compat.h, which launch() calls them from.
void set(bool on);
// Waits for the recorded events and returns the totals by name since the last take (largest first).
std::vector<KernelTime> take();

}  // namespace multinorm::cuda::profiler
