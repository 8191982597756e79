// Backend selection on a machine without a GPU: the binary runs and falls back to the CPU.
#include <gtest/gtest.h>

#include <cstdlib>

#include "multinorm/comm.h"

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

// The launchers' world-size variables are read (the communicator refuses to start as a lone rank 0
// when they say several ranks: tests/data_parallel.sh runs that end to end).
TEST(Launcher, WorldSizeFromTheCommonLaunchers) {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE", "SLURM_STEP_NUM_TASKS", "MPI_LOCALNRANKS"})
    ::unsetenv(v);
  EXPECT_EQ(multinorm::launcher_world().size, 0);
  for (const char* v : {"PMI_SIZE", "SLURM_STEP_NUM_TASKS", "MV2_COMM_WORLD_SIZE"}) {
    ::setenv(v, "8", 1);
    const auto w = multinorm::launcher_world();
    EXPECT_EQ(w.variable, v);
    EXPECT_EQ(w.size, 8);
    ::unsetenv(v);
  }
}
