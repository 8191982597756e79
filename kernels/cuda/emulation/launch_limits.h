// The launch limits of the target architecture, checked by the emulated build at every launch as the
// CUDA runtime checks them on an A100 (sm_80, the smallest target; an H100 allows more):
//   - a block has 1..1024 threads, blockDim.z <= 64; gridDim.y and .z <= 65535;
//   - static shared memory <= 48 KB (ptxas refuses more);
//   - dynamic shared memory above 48 KB minus the static size only after
//     cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) on the current
//     device (the attribute is per device, as each device's context has its own), and static +
//     that attribute never above sm_80's 163 KB opt-in limit;
//   - registers: ptxas's registers per thread, allocated per warp in units of 256, times the block's
//     warps, at most 64K per block ("too many resources requested for launch").
// Static shared memory and registers come from the nvcc build's ptxas report (-Xptxas -v, written by
// scripts/nvcc_with_resources.sh under build/ptxas/), matched to the emulated kernel by its demangled
// signature (symbols.h); a kernel the report does not name (test kernels) is checked for the limits
// that need no figures, or refused when MULTINORM_EMU_REQUIRE_FIGURES=1 (the backend's tests).
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

namespace cuda_emu::limits {

constexpr size_t kStaticSharedMax = 48 * 1024;           // per block, without opt-in
constexpr size_t kSharedOptinMax = 163 * 1024;           // sm_80 (A100): static + dynamic with opt-in
constexpr int kRegistersPerBlock = 64 * 1024;            // sm_80 and sm_90
constexpr int kRegisterAllocationUnit = 256;              // registers, per warp

struct KernelFigures {
  int registers = -1;        // per thread, the largest over the architectures built; -1: unknown
  long static_shared = -1;   // bytes; -1: unknown
};

// The ptxas figures of the kernel at `fn` ({-1, -1} when the report does not name it).
KernelFigures figures(const void* fn);
// How many kernels the report names, and where it was read from (for doctor and the tests).
int report_size(std::string* source);
// For tests: figures for a kernel the nvcc build did not compile (a planted bug).
void set_figures_for_test(const void* fn, KernelFigures f);

// cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes).
cudaError_t set_max_dynamic_shared(const void* fn, int bytes);

// "" when the launch is valid, else why not (the CUDA error a GPU would return, and the figures).
std::string check_launch(const void* fn, dim3 grid, dim3 block, size_t dynamic_shared);

}  // namespace cuda_emu::limits
