// The backends the op and model tests run on: "cpu", and "cuda", which is the emulated CUDA build
// (the kernel sources executed on the CPU) unless MULTINORM_TEST_CUDA_PLUGIN names a real plugin on
// a GPU machine. A test parameterised by backend skips "cuda" when no plugin was built.
#pragma once
#include <cstdlib>
#include <memory>
#include <string>

#include "multinorm/backend.h"
#include "multinorm/device.h"

namespace multinorm::testing {

inline const CudaProbe* test_cuda_plugin() {
  static const CudaProbe probe = [] {
    if (const char* p = std::getenv("MULTINORM_TEST_CUDA_PLUGIN"); p && *p) return probe_cuda_plugin(p);
#ifdef MULTINORM_EMULATED_PLUGIN
    // Every kernel the tests launch must be in the nvcc build's ptxas report: its launches are then
    // checked against its registers and shared memory (kernels/cuda/emulation/launch_limits.h).
    ::setenv("MULTINORM_EMU_REQUIRE_FIGURES", "1", 0);
    return probe_cuda_plugin(MULTINORM_EMULATED_PLUGIN);
#else
    return CudaProbe{};
#endif
  }();
  return probe.plugin_loaded ? &probe : nullptr;
}

// nullptr when `name` is "cuda" and no CUDA plugin is available.
inline std::unique_ptr<Backend> make_test_backend(const std::string& name, int cpu_threads) {
  if (name == "cpu") return make_cpu_backend(cpu_threads);
  const CudaProbe* p = test_cuda_plugin();
  return p ? make_cuda_backend(*p) : nullptr;
}

inline std::string backend_param_name(const ::testing::TestParamInfo<std::string>& i) { return i.param; }

}  // namespace multinorm::testing
