// The emulated build's launch limits (kernels/cuda/emulation/launch_limits.h) against the nvcc build's
// own ptxas report: a real kernel file (rmsnorm.cu) is compiled into this test by g++, and its kernels
// must be found in the report by their signatures, with ptxas' registers and shared memory. Planted
// bugs prove each limit fires: registers over a block's 64K, dynamic shared memory above 48 KB without
// the opt-in, static shared memory above 48 KB, more than sm_80's 163 KB.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "../kernels/cuda/cuda_compat.h"
#include "../kernels/cuda/emulation/launch_limits.h"
#include "../kernels/cuda/rmsnorm.cu"
#include "multinorm/error.h"

namespace lim = cuda_emu::limits;
using multinorm::cuda::bf16;

namespace {

__global__ void uses_dynamic_shared(float* out) {
  MN_DYNAMIC_SHARED(float, s);
  s[threadIdx.x] = 1.0f;
  __syncthreads();
  out[threadIdx.x] = s[(threadIdx.x + 1) % blockDim.x];
}
__global__ void uses_dynamic_shared_on_two_devices(float* out) {
  MN_DYNAMIC_SHARED(float, s);
  s[threadIdx.x] = 2.0f;
  __syncthreads();
  out[threadIdx.x] = s[(threadIdx.x + 1) % blockDim.x];
}
__global__ void heavy_registers(float* out) { out[threadIdx.x] = 1.0f; }
__global__ void big_static_shared(float* out) { out[threadIdx.x] = 1.0f; }

// A launch through the emulator itself (multinorm::cuda::launch opts in on its own).
std::string raw_launch(const char* name, void (*kernel)(float*), dim3 block, size_t dynamic, float* out) {
  try {
    cuda_emu::launch(name, reinterpret_cast<const void*>(kernel), dim3(1), block, dynamic, [&] { kernel(out); });
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

struct Device {
  float* p = nullptr;
  explicit Device(size_t n) { cudaMalloc(reinterpret_cast<void**>(&p), n * sizeof(float)); }
  ~Device() { cudaFree(p); }
};

}  // namespace

TEST(LaunchLimits, ThePtxasReportNamesTheBuildsKernels) {
#ifndef MULTINORM_EXPECT_PTXAS_REPORT
  GTEST_SKIP() << "no nvcc build: no ptxas report";
#else
  std::string source;
  const int kernels = lim::report_size(&source);
  EXPECT_GT(kernels, 30) << source;  // every kernel of the plugin, each template instantiation
  // The g++-compiled kernel is matched to nvcc's by its demangled signature.
  const lim::KernelFigures fwd = lim::figures(reinterpret_cast<const void*>(&multinorm::cuda::rmsnorm_forward_kernel<bf16>));
  EXPECT_GT(fwd.registers, 8);
  EXPECT_LT(fwd.registers, 256);
  EXPECT_EQ(fwd.static_shared, 0);
  const lim::KernelFigures rows = lim::figures(reinterpret_cast<const void*>(&multinorm::cuda::rmsnorm_backward_rows_kernel<float>));
  EXPECT_GT(rows.registers, 8);
  EXPECT_EQ(rows.static_shared, 0);  // a warp per row: shuffles only; its dw partial is dynamic
  const lim::KernelFigures dw = lim::figures(reinterpret_cast<const void*>(&multinorm::cuda::rmsnorm_backward_dw_kernel<float>));
  EXPECT_EQ(dw.static_shared, 8 * 32 * 4);  // the 8 partial groups of 32 channels
#endif
}

TEST(LaunchLimits, RegistersPerBlockFromThePtxasFigures) {
  Device out(1024);
  lim::set_figures_for_test(reinterpret_cast<const void*>(&heavy_registers), {255, 0});
  // 255 registers: 8,160 per warp, allocated as 8,192: 8 warps fill the 65,536 exactly.
  EXPECT_EQ(raw_launch("heavy_registers", heavy_registers, dim3(256), 0, out.p), "");
  const std::string e = raw_launch("heavy_registers", heavy_registers, dim3(288), 0, out.p);
  EXPECT_NE(e.find("heavy_registers"), std::string::npos) << e;
  EXPECT_NE(e.find("288 threads x 255 registers"), std::string::npos) << e;
  EXPECT_NE(e.find("too many resources requested for launch"), std::string::npos) << e;
}

TEST(LaunchLimits, DynamicSharedMemoryAbove48KbNeedsTheOptIn) {
  Device out(1024);
  const void* k = reinterpret_cast<const void*>(&uses_dynamic_shared);
  EXPECT_EQ(raw_launch("uses_dynamic_shared", uses_dynamic_shared, dim3(128), 48 * 1024, out.p), "");
  std::string e = raw_launch("uses_dynamic_shared", uses_dynamic_shared, dim3(128), 64 * 1024, out.p);
  EXPECT_NE(e.find("uses_dynamic_shared"), std::string::npos) << e;
  EXPECT_NE(e.find("cudaFuncAttributeMaxDynamicSharedMemorySize"), std::string::npos) << e;
  EXPECT_EQ(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024), cudaSuccess);
  EXPECT_EQ(raw_launch("uses_dynamic_shared", uses_dynamic_shared, dim3(128), 64 * 1024, out.p), "");
  e = raw_launch("uses_dynamic_shared", uses_dynamic_shared, dim3(128), 80 * 1024, out.p);
  EXPECT_NE(e.find("set by cudaFuncSetAttribute"), std::string::npos) << e;
  // sm_80 allows 163 KB with the opt-in; an H100 would allow 227 KB, which an A100 refuses.
  EXPECT_EQ(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, 163 * 1024), cudaSuccess);
  EXPECT_EQ(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024), cudaErrorInvalidValue);
  cudaGetLastError();
  // multinorm::cuda::launch opts in by itself, and names the kernel when even 163 KB is too little.
  EXPECT_NO_THROW(multinorm::cuda::launch("uses_dynamic_shared", uses_dynamic_shared, dim3(1), dim3(64), 100 * 1024, nullptr, out.p));
  try {
    multinorm::cuda::launch("uses_dynamic_shared", uses_dynamic_shared, dim3(1), dim3(64), 170 * 1024, nullptr, out.p);
    ADD_FAILURE() << "170 KB of dynamic shared memory was accepted";
  } catch (const multinorm::Error& x) {
    EXPECT_NE(std::string(x.what()).find("uses_dynamic_shared needs 174080 B of dynamic shared memory"), std::string::npos) << x.what();
  }
}

TEST(LaunchLimits, TheOptInIsPerDevice) {
  // A GPU keeps cudaFuncAttributeMaxDynamicSharedMemorySize per device context: a second backend on
  // another GPU of the process must set it again. The emulator keeps it per device as well (the
  // raw launch on device 1 is refused: the planted bug), and the launcher opts in on each device.
  cuda_emu::set_device_count_for_test(2);
  Device out(1024);
  auto k = uses_dynamic_shared_on_two_devices;
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  EXPECT_NO_THROW(multinorm::cuda::launch("uses_dynamic_shared_on_two_devices", k, dim3(1), dim3(64), 100 * 1024, nullptr, out.p));
  EXPECT_EQ(raw_launch("uses_dynamic_shared_on_two_devices", k, dim3(64), 100 * 1024, out.p), "");
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  const std::string e = raw_launch("uses_dynamic_shared_on_two_devices", k, dim3(64), 100 * 1024, out.p);
  EXPECT_NE(e.find("needs cudaFuncSetAttribute"), std::string::npos) << e;
  EXPECT_NO_THROW(multinorm::cuda::launch("uses_dynamic_shared_on_two_devices", k, dim3(1), dim3(64), 100 * 1024, nullptr, out.p));
  EXPECT_EQ(raw_launch("uses_dynamic_shared_on_two_devices", k, dim3(64), 100 * 1024, out.p), "");
  cuda_emu::set_device_count_for_test(0);
}

TEST(LaunchLimits, StaticSharedMemoryAbove48KbIsRefused) {
  Device out(64);
  lim::set_figures_for_test(reinterpret_cast<const void*>(&big_static_shared), {16, 50 * 1024});
  const std::string e = raw_launch("big_static_shared", big_static_shared, dim3(32), 0, out.p);
  EXPECT_NE(e.find("51200 B of static shared memory"), std::string::npos) << e;
}

TEST(LaunchLimits, RmsNormBackwardOnRowsWiderThan48KbOfShared) {
  // C = 16384: the rows kernel's per-channel dw partials are 64 KB of dynamic shared memory, which a
  // GPU launches only after the opt-in (the launcher's). Checked against the plain formula.
  const int64_t N = 3, C = 16384;
  std::vector<float> x(N * C), w(C), dout(N * C), rstd(N);
  for (int64_t i = 0; i < N * C; ++i) x[i] = 0.001f * float(i % 97) - 0.04f, dout[i] = 0.002f * float(i % 89) - 0.08f;
  for (int64_t c = 0; c < C; ++c) w[c] = 1.0f + 0.0001f * float(c % 31);
  for (int64_t r = 0; r < N; ++r) {
    double ss = 0;
    for (int64_t c = 0; c < C; ++c) ss += double(x[r * C + c]) * x[r * C + c];
    rstd[r] = float(1.0 / std::sqrt(ss / C + 1e-6));
  }
  auto up = [](const std::vector<float>& h) {
    float* d = nullptr;
    cudaMalloc(reinterpret_cast<void**>(&d), h.size() * 4);
    cudaMemcpy(d, h.data(), h.size() * 4, cudaMemcpyHostToDevice);
    return d;
  };
  float *dx = up(std::vector<float>(N * C)), *dw = up(std::vector<float>(C, 0.0f)), *dx_in = up(x), *w_d = up(w), *dout_d = up(dout),
        *rstd_d = up(rstd);
  float* scratch = up(std::vector<float>(multinorm::cuda::rmsnorm_backward_scratch(N, C)));
  multinorm::cuda::rmsnorm_backward<float, float>(dx, nullptr, dw, dout_d, dx_in, w_d, rstd_d, N, C, false, scratch, nullptr);
  std::vector<float> dw_h(C);
  cudaMemcpy(dw_h.data(), dw, C * 4, cudaMemcpyDeviceToHost);
  for (int64_t c = 0; c < C; c += 1531) {
    double e = 0;
    for (int64_t r = 0; r < N; ++r) e += double(dout[r * C + c]) * x[r * C + c] * rstd[r];
    EXPECT_NEAR(dw_h[c], e, 1e-6 + 1e-5 * std::abs(e)) << c;  // FP32 sum of 3 terms
  }
  for (float* p : {dx, dw, dx_in, w_d, dout_d, rstd_d, scratch}) cudaFree(p);
}
