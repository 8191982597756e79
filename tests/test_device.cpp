// Backend selection: on a machine without a GPU the binary runs and falls back to the CPU (on a GPU
// node those tests skip, saying so: there is nothing to fall back from).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include <stdlib.h>

#include "multinorm/comm.h"

#include "multinorm/device.h"
#include "multinorm/error.h"

using namespace multinorm;

namespace {
// "" without a usable GPU; else why a test of the no-GPU behaviour cannot run here.
std::string usable_gpu() {
  const CudaProbe& p = probe_cuda();
  if (p.device_count == 0) return "";
  return "a usable GPU is present (" + std::to_string(p.device_count) + " device(s)" +
         (p.devices.empty() ? std::string() : std::string(", ") + p.devices[0].name) + "): this test is of a machine without one";
}
}  // namespace

TEST(Device, CpuOnRequest) {
  const BackendChoice c = choose_backend("cpu");
  EXPECT_EQ(c.kind, BackendKind::Cpu);
}

TEST(Device, AutoFallsBackToCpuAndSaysWhy) {
  if (const std::string why = usable_gpu(); !why.empty()) GTEST_SKIP() << why;
  const BackendChoice c = choose_backend("auto");
  EXPECT_EQ(c.kind, BackendKind::Cpu);
  EXPECT_NE(c.reason.find("cpu (auto: "), std::string::npos) << c.reason;
}

TEST(Device, CudaWithoutAUsableGpuIsAnError) {
  EXPECT_THROW(choose_backend("tpu"), ConfigError);
  if (const std::string why = usable_gpu(); !why.empty()) GTEST_SKIP() << why;
  EXPECT_THROW(choose_backend("cuda"), Error);
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

// `auto` falls back to the CPU on a machine without a GPU, not on a GPU node whose GPUs are unusable.
TEST(Device, AutoRefusesABrokenGpuNode) {
  CudaProbe p;
  p.plugin_loaded = true;
  p.device_error = "cudaGetDeviceCount: CUDA driver version is insufficient for CUDA runtime version (cudaErrorInsufficientDriver, code 35)";
  p.device_error_code = 35;
  EXPECT_EQ(auto_refusal(p), "") << "no driver in the process: a CPU machine";
  p.driver_loaded = true;
  EXPECT_NE(auto_refusal(p).find("insufficient"), std::string::npos);
  p.device_error_code = 100;  // a driver, no device
  EXPECT_EQ(auto_refusal(p), "");
  p.device_error_code = 35, p.emulated = true;
  EXPECT_EQ(auto_refusal(p), "");
}

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

// Where the CUDA libraries are looked for: the toolkit ($CUDA_HOME), and a Python environment's pip
// wheels (site-packages/nvidia/<name>/lib), found through $VIRTUAL_ENV or a python3 on PATH.
TEST(CudaLibraries, SearchTheToolkitAndPythonEnvironments) {
  char tmpl[] = "/tmp/multinorm-cudalibs-XXXXXX";
  const std::string root = ::mkdtemp(tmpl);
  const std::string venv = root + "/venv", toolkit = root + "/cuda", other = root + "/conda";
  for (const std::string& d : {venv + "/lib/python3.12/site-packages/nvidia/cublas/lib", venv + "/lib/python3.12/site-packages/nvidia/nccl/lib",
                               toolkit + "/lib64", other + "/bin", other + "/lib/python3.11/site-packages/nvidia/cu13/lib"})
    ASSERT_EQ(std::system(("mkdir -p '" + d + "'").c_str()), 0);
  ASSERT_EQ(std::system(("touch '" + other + "/bin/python3' && chmod +x '" + other + "/bin/python3'").c_str()), 0);
  const char* keep_path = std::getenv("PATH");
  const std::string path = keep_path ? keep_path : "";
  ::setenv("VIRTUAL_ENV", venv.c_str(), 1);
  ::setenv("CUDA_HOME", toolkit.c_str(), 1);
  ::setenv("PATH", (other + "/bin:" + path).c_str(), 1);
  const std::vector<std::string> dirs = cuda_library_dirs();
  ::unsetenv("VIRTUAL_ENV"), ::unsetenv("CUDA_HOME"), ::setenv("PATH", path.c_str(), 1);
  auto at = [&](const std::string& d) { return std::find(dirs.begin(), dirs.end(), d) - dirs.begin(); };
  const auto n = static_cast<long>(dirs.size());
  EXPECT_LT(at(toolkit + "/lib64"), n);
  EXPECT_LT(at(venv + "/lib/python3.12/site-packages/nvidia/cublas/lib"), n);
  EXPECT_LT(at(venv + "/lib/python3.12/site-packages/nvidia/nccl/lib"), n);
  EXPECT_LT(at(other + "/lib/python3.11/site-packages/nvidia/cu13/lib"), n) << "a python3 on PATH";
  EXPECT_LT(at(toolkit + "/lib64"), at(venv + "/lib/python3.12/site-packages/nvidia/cublas/lib")) << "the toolkit first";
  std::system(("rm -rf '" + root + "'").c_str());

  // A library not found names where it was looked for and the other versions seen.
  CudaLibraries libs;
  libs.searched = {"/usr/local/cuda/lib64"};
  libs.libraries.push_back({"libcublasLt.so.13", "", "", "/usr/local/cuda/lib64/libcublasLt.so.12"});
  const std::string m = libs.missing();
  EXPECT_NE(m.find("libcublasLt.so.13 not found"), std::string::npos) << m;
  EXPECT_NE(m.find("/usr/local/cuda/lib64/libcublasLt.so.12"), std::string::npos) << m;
  EXPECT_NE(m.find("built against another CUDA"), std::string::npos) << m;
}

// A test that kills the binary, for scripts/gpu_check/run_gtests.py (gpu_check's test step): after a
// crash it must record the test and run the ones after it in a new process. tests/gpu_check.sh sets
// MULTINORM_TEST_PLANT_CRASH=1; otherwise this skips.
TEST(Planted, CrashWhenAsked) {
  if (!std::getenv("MULTINORM_TEST_PLANT_CRASH")) GTEST_SKIP() << "a planted crash, for tests/gpu_check.sh (MULTINORM_TEST_PLANT_CRASH=1)";
  std::abort();
}
