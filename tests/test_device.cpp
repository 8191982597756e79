// Backend selection on a machine without a GPU: the binary runs and falls back to the CPU.
#include <gtest/gtest.h>

#include "multinorm/device.h"
#include "multinorm/error.h"

using namespace multinorm;

TEST(Device, CpuOnRequest) {
  const BackendChoice c = choose_backend("cpu");
  EXPECT_EQ(c.kind, BackendKind::Cpu);
}

TEST(Device, AutoFallsBackToCpuAndSaysWhy) {
  const BackendChoice c = choose_backend("auto");
  EXPECT_EQ(c.kind, BackendKind::Cpu);
  EXPECT_NE(c.reason.find("cpu (auto: "), std::string::npos) << c.reason;
}

TEST(Device, CudaWithoutAUsableGpuIsAnError) {
  EXPECT_THROW(choose_backend("cuda"), Error);
  EXPECT_THROW(choose_backend("tpu"), ConfigError);
}

#ifdef MULTINORM_EXPECT_CUDA_PLUGIN
TEST(Device, PluginBuiltIsFoundAndLoaded) {
  const CudaProbe& p = probe_cuda();
  EXPECT_TRUE(p.plugin_loaded) << p.load_error;
  EXPECT_GE(p.runtime_version, 12000);
  // Here there is no GPU: cudaGetDeviceCount's error is reported rather than hidden.
  if (p.device_count == 0) {
    EXPECT_FALSE(p.device_error.empty());
  }
}
#endif
