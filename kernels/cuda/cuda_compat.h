// The one header every CUDA source of multinorm includes. Under nvcc it is plain CUDA; under g++ it
// is the emulated build (kernels/cuda/emulation/), which executes the same kernel sources on the
// CPU so CI can compare every kernel with the CPU backend. Rules that keep one source valid in both
// worlds (docs/cuda.md):
//   - kernels are launched only through launch() below (g++ cannot parse <<< >>>);
//   - dynamic shared memory only through MN_DYNAMIC_SHARED (extern __shared__ cannot be emulated);
//   - no inline PTX, grid-wide synchronisation, or __CUDA_ARCH__ branches in kernel files: the
//     tensor-core instructions (mma.sync, ldmatrix) come from kernels/cuda/warp_matrix.cuh, the one
//     header with inline PTX, which has an emulated path for each (tests/lint_cuda.sh enforces it).
#pragma once

#ifdef __CUDACC__
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#define MN_EMULATED 0
// A kernel's register budget: at most `threads` a block, at least `blocks` blocks an SM (ptxas caps
// the registers a thread to fit; the emulated build has no registers to cap).
#define MN_LAUNCH_BOUNDS(threads, blocks) __launch_bounds__(threads, blocks)
// The block's dynamic shared memory as an array of `type` (16-byte aligned).
#define MN_DYNAMIC_SHARED(type, name)                                  \
  extern __shared__ __align__(16) unsigned char mn_dynamic_shared_[]; \
  type* name = reinterpret_cast<type*>(mn_dynamic_shared_)
#else
#include "emulation/cuda_emulation.h"
#define MN_EMULATED 1
#define MN_LAUNCH_BOUNDS(threads, blocks)
#define MN_DYNAMIC_SHARED(type, name) type* name = static_cast<type*>(::cuda_emu::dynamic_shared())
#endif

#include <string>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <utility>

namespace multinorm::cuda {

using bf16 = __nv_bfloat16;

// Throws multinorm::Error naming the failed CUDA call and what it was doing (defined in
// kernels/cuda/check.cpp so this header does not pull in the project's error types).
[[noreturn]] void throw_cuda_error(const std::string& what, cudaError_t e);
[[noreturn]] void throw_launch_error(const char* kernel, dim3 grid, dim3 block, size_t shared_bytes, const std::string& why);
// Raises the kernel's cudaFuncAttributeMaxDynamicSharedMemorySize to `bytes` when a launch asks for
// more than it was allowed so far (the default allows 48 KB minus the static shared memory): the
// opt-in that a launch with more dynamic shared memory needs; an error naming the kernel when even
// the device's opt-in limit is too small (163 KB on an A100). Defined in check.cu.
void allow_dynamic_shared(const char* name, const void* kernel, size_t bytes);
// Debug builds (no NDEBUG): synchronise after every launch so that an error in a kernel's execution
// (an illegal address) is reported with that kernel's name, not at the next synchronisation.
// Release builds check the launch itself after every launch, and execution errors at the update's
// synchronisation; CUDA_LAUNCH_BLOCKING=1 gives release builds the debug behaviour.
void check_after_launch(const char* name, dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream);
// Per-kernel timing (kernels/cuda/profiler.h): an event pair around each launch while it is on.
namespace profiler {
extern bool g_on;
void begin(const char* name, cudaStream_t stream);
void end(cudaStream_t stream);
}  // namespace profiler
#if !defined(__CUDACC__)
// The emulated launch's check of its pointer arguments (cuda_emulation.h).
template <class Tuple, size_t... I>
void check_pointer_arguments(const Tuple& params, std::index_sequence<I...>) {
  auto one = [](int index, const auto& v) {
    using V = std::decay_t<decltype(v)>;
    if constexpr (std::is_pointer_v<V> && std::is_object_v<std::remove_pointer_t<V>>) ::cuda_emu::check_pointer_argument(index, typeid(V).name(), static_cast<const void*>(v));
  };
  (one(static_cast<int>(I), std::get<I>(params)), ...);
  (void)one;  // a kernel without parameters
}
#endif
// Launches kernel<<<grid, block, shared_bytes, stream>>>(args...) and checks the launch. `name`
// is what an error message calls the kernel. Arguments are converted once to the kernel's
// parameter types (as the CUDA runtime does) and every thread gets its own copy.
template <class... Params, class... Args>
void launch(const char* name, void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
            Args&&... args) {
  static_assert(sizeof...(Params) == sizeof...(Args), "launch: wrong number of kernel arguments");
  if (shared_bytes > 0) allow_dynamic_shared(name, reinterpret_cast<const void*>(kernel), shared_bytes);
  const bool timed = profiler::g_on;
  if (timed) profiler::begin(name, stream);
#ifdef __CUDACC__
  kernel<<<grid, block, shared_bytes, stream>>>(std::forward<Args>(args)...);
  check_after_launch(name, grid, block, shared_bytes, stream);
#else
  // The emulation runs launches synchronously, in issue order; a capturing stream records them. Every
  // pointer argument must be reachable by a kernel when the launch runs (a replayed graph's too), and
  // every thread checks the reach of its accesses once it has copied its arguments (racecheck.h).
  using ParamTuple = std::tuple<std::decay_t<Params>...>;
  const ParamTuple params(static_cast<std::decay_t<Params>>(std::forward<Args>(args))...);
  auto run = [=] {
    try {
      check_pointer_arguments(params, std::index_sequence_for<Params...>{});
      ::cuda_emu::launch(name, reinterpret_cast<const void*>(kernel), grid, block, shared_bytes, [&] {
        // The arguments and the kernel's address onto this thread's stack, read from the launch's
        // (host) frame before racecheck starts checking this thread's reach: the copy escapes first.
        ParamTuple copy = params;
        auto* const fn = kernel;
        ::cuda_emu::kernel_entry(&copy);
        std::apply(fn, copy);
        ::cuda_emu::kernel_exit();
      });
    } catch (const std::exception& ex) {
      throw_launch_error(name, grid, block, shared_bytes, ex.what());
    }
  };
  if (!::cuda_emu::record_if_capturing(stream, run)) {
    try {
      run();
    } catch (...) {
      if (timed) profiler::end(stream);
      throw;
    }
  }
#endif
  if (timed) profiler::end(stream);
}

inline unsigned ceil_div(long long a, long long b) { return static_cast<unsigned>((a + b - 1) / b); }

}  // namespace multinorm::cuda
