// The CUDA emulation layer itself (kernels/cuda/emulation/): CUDA's semantics for blocks, barriers,
// warp collectives and atomics, and its strictness: misuse a GPU would hang on or silently get wrong
// is an error. Every checker has a planted bug here that proves it fires and names the kernel, the
// block, the thread and the address: shared-memory races (racecheck), uninitialised shared memory,
// misaligned accesses, warp-collective misuse, and races through global memory, which the fiber
// orders catch (a launch run under several orders must leave the same bytes). Kernels here are
// compiled by g++ against kernels/cuda/cuda_compat.h, with racecheck's instrumentation, exactly as
// the backend's kernels are.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <deque>
#include <string>
#include <vector>

#include "../kernels/cuda/cuda_compat.h"
#include "../kernels/cuda/device_utils.cuh"
#include "../kernels/cuda/ring_spans.h"
#include "../kernels/cuda/emulation/device_memory.h"
#include "emulated_device.h"
#include "multinorm/error.h"

using emulated::DeviceArray;
using emulated::error_of;
using multinorm::cuda::launch;

namespace {

// Sets the emulation's fiber order and worker count for one scope.
struct EmuEnv {
  EmuEnv(const char* order, const char* workers) {
    ::setenv("MULTINORM_EMU_ORDER", order, 1);
    ::setenv("MULTINORM_EMU_WORKERS", workers, 1);
  }
  ~EmuEnv() {
    ::unsetenv("MULTINORM_EMU_ORDER");
    ::unsetenv("MULTINORM_EMU_WORKERS");
  }
};
// Sets one environment variable for one scope.
struct ScopedEnv {
  const char* name;
  ScopedEnv(const char* n, const char* value) : name(n) { ::setenv(n, value, 1); }
  ~ScopedEnv() { ::unsetenv(name); }
};

// Whether the kernels of this binary carry racecheck's instrumentation (not in the sanitizer builds).
#ifdef MULTINORM_EMU_RACECHECK
constexpr bool kRacecheck = true;
#else
constexpr bool kRacecheck = false;
#endif


// ---- the emulated address space (device_memory.h): what a kernel may reach ----------------------------
// out[i] = 2 in[i]: every pointer an argument.
__global__ void doubled(float* out, const float* in, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = 2.0f * in[i];
}
// A descriptor table in device memory, as the multi-tensor kernels read theirs: each item's pointer
// is not an argument, so only the accesses through it can be checked.
struct ScaleItem {
  float* x;
  int64_t n;
};
__global__ void scale_items(const ScaleItem* items, int count) {
  const ScaleItem item = items[blockIdx.x % count];
  for (int64_t i = threadIdx.x; i < item.n; i += blockDim.x) item.x[i] *= 3.0f;
}
// A thread's own stack (a local array indexed at run time) is reachable, as a GPU's local memory is.
__global__ void local_array(float* out) {
  float scratch[32];
  for (int k = 0; k < 32; ++k) scratch[(k * 7) % 32] = float(k + static_cast<int>(threadIdx.x));
  out[threadIdx.x] = scratch[threadIdx.x];
}

// Warp shuffle tree, then one warp over the warp sums (the standard two-level block reduction).
__global__ void block_reduce(const float* x, float* out, int n) {
  __shared__ float warp_sums[32];
  float s = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) s += x[blockIdx.x * n + i];
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = s;
  __syncthreads();
  if (threadIdx.x < 32) {
    float v = threadIdx.x < blockDim.x / 32 ? warp_sums[threadIdx.x] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (threadIdx.x == 0) out[blockIdx.x] = v;
  }
}

// Each thread reads its right neighbour's value through global memory: correct only with the barrier
// (racecheck watches shared memory; a race through global memory is left to the fiber orders).
__global__ void neighbour(float* out, float* scratch, bool with_barrier) {
  scratch[threadIdx.x] = float(threadIdx.x);
  if (with_barrier) __syncthreads();
  out[threadIdx.x] = scratch[(threadIdx.x + 1) % blockDim.x];
}

// Block b reads what block b - 1 wrote: blocks that depend on each other (a GPU runs them in any order).
__global__ void chained_blocks(float* x) {
  if (threadIdx.x == 0) x[blockIdx.x + 1] = x[blockIdx.x] + 1.0f;
}

// After a barrier every thread adds one to its own element, then reads its neighbour's: the
// neighbour's add is not ordered with that read (read after write or write after read, by order).
__global__ void shared_neighbour_race(float* out, bool with_second_barrier) {
  __shared__ float s[64];
  s[threadIdx.x] = float(threadIdx.x);
  __syncthreads();
  s[threadIdx.x] += 1.0f;
  if (with_second_barrier) __syncthreads();
  out[threadIdx.x] = s[(threadIdx.x + 1) % 64];
}

// Lane 0 writes, lane `reader` reads, with `sync` between them: 0 nothing, 1 a shuffle (which does not
// order memory), 2 __syncwarp over lanes 0 and 1, 3 __syncwarp over the whole warp.
__global__ void warp_handoff(float* out, int reader, int sync) {
  __shared__ float s[32];
  const unsigned lane = threadIdx.x;
  if (lane == 0) s[0] = 42.0f;
  if (sync == 1) out[32 + lane] = __shfl_sync(0xffffffffu, float(lane), 0);
  if (sync == 2 && lane < 2) __syncwarp(0x3u);
  if (sync == 3) __syncwarp();
  if (lane == static_cast<unsigned>(reader)) out[lane] = s[0];
}

// A 16-byte pack read `offset_elements` bf16s past a 16-byte aligned row.
__global__ void pack_load(float* out, const __nv_bfloat16* row, int offset_elements) {
  struct alignas(16) Pack {
    __nv_bfloat16 v[8];
  };
  const Pack p = *reinterpret_cast<const Pack*>(row + offset_elements);
  out[threadIdx.x] = __bfloat162float(p.v[threadIdx.x % 8]);
}

// The kernels' own packs (device_utils.cuh) `offset_elements` bf16s past a 16-byte aligned row: every
// value used, so g++ splits the copy into 2-byte loads (and the store into 2-byte stores), which
// only the pack's own check sees as the 16-byte access the GPU makes.
__global__ void kernel_pack_load(float* out, const __nv_bfloat16* row, int offset_elements) {
  float x[8];
  multinorm::cuda::load_values<__nv_bfloat16, 8>(row + offset_elements, 0, x);
  float s = 0.0f;
  for (float v : x) s += v;
  out[threadIdx.x] = s;
}
__global__ void kernel_pack_assign(multinorm::cuda::Pack<__nv_bfloat16>* out, const __nv_bfloat16* row, int offset_elements) {
  if (threadIdx.x == 0) out[0] = *reinterpret_cast<const multinorm::cuda::Pack<__nv_bfloat16>*>(row + offset_elements);
}
__global__ void kernel_pack_store(__nv_bfloat16* row, int offset_elements) {
  const __nv_bfloat16 x[8] = {};
  if (threadIdx.x == 0) multinorm::cuda::store_packs<__nv_bfloat16, 8>(row + offset_elements, 0, x);
}

// A float read `offset_bytes` past a float row (the CPU loads a misaligned float without a fault).
__global__ void float_load(float* out, const float* row, int offset_bytes) {
  out[threadIdx.x] = *reinterpret_cast<const float*>(reinterpret_cast<const char*>(row) + offset_bytes);
}

// Writes one element past the end of `x` (n elements) from the last thread.
__global__ void write_past_the_end(float* x, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i <= n) x[i] = 1.0f;
}

// Every thread takes a ticket when it first runs, and a second one after a barrier.
__global__ void tickets(int* first, int* counter) {
  const int t = threadIdx.x + blockIdx.x * blockDim.x;
  first[t] = atomicAdd(counter, 1);
}

// Half the warp votes, the other half goes on to __syncwarp: divergent participation.
__global__ void divergent_ballot(unsigned* out) {
  if (threadIdx.x < 16) out[threadIdx.x] = __ballot_sync(0xffffffffu, 1);
  __syncwarp();
}

__global__ void divergent_barrier(float* out) {
  if (threadIdx.x == 5) return;
  __syncthreads();
  out[threadIdx.x] = 1.0f;
}

__global__ void shuffle_with_exited_lane(float* out) {
  if (threadIdx.x == 3) return;
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
}

__global__ void disagreeing_masks(float* out) {
  const unsigned mask = threadIdx.x < 16 ? 0xffffffffu : 0x0000ffffu;
  out[threadIdx.x] = __shfl_down_sync(mask, 1.0f, 1);
}

__global__ void do_nothing() {}
// Every thread reads one flag in pinned host memory (the planted bug), or thread 0 of each block does.
__global__ void read_pinned_flag(float* out, const unsigned* flag, bool every_thread) {
  if (!every_thread && threadIdx.x != 0) return;
  out[blockIdx.x * blockDim.x + threadIdx.x] = float(*static_cast<const volatile unsigned*>(flag));
}

// Results of every shuffle flavour at width 8 plus the votes, for the rules check.
__global__ void shuffles(int* up, int* down, int* xr, int* idx, unsigned* ballot, int* any, int* all) {
  const int lane = threadIdx.x;
  up[lane] = __shfl_up_sync(0xffffffffu, lane, 3, 8);
  down[lane] = __shfl_down_sync(0xffffffffu, lane, 3, 8);
  xr[lane] = __shfl_xor_sync(0xffffffffu, lane, 5, 8);
  idx[lane] = __shfl_sync(0xffffffffu, lane, 9, 8);  // srcLane 9 % 8 = 1 within each group of 8
  ballot[lane] = __ballot_sync(0xffffffffu, lane % 3 == 0);
  any[lane] = __any_sync(0xffffffffu, lane == 31);
  all[lane] = __all_sync(0xffffffffu, lane < 31);
}

__global__ void count_atomically(int* counter, float* fsum) {
  atomicAdd(counter, 1);
  atomicAdd(fsum, 1.0f);
}

__global__ void read_uninitialised(float* out) {
  MN_DYNAMIC_SHARED(float, s);
  out[blockIdx.x * blockDim.x + threadIdx.x] = s[threadIdx.x];
}


}  // namespace

TEST(CudaEmulation, TwoLevelBlockReductionIsExactUnderEveryOrderAndWorkerCount) {
  const int n = 1000, blocks = 7;
  std::vector<float> h(n * blocks);
  for (size_t i = 0; i < h.size(); ++i) h[i] = float(i % 13) * 0.5f;  // exact in FP32, any order
  for (const char* order : {"forward", "reverse", "random"})
    for (const char* workers : {"1", "3"}) {
      EmuEnv env(order, workers);
      for (unsigned threads : {32u, 96u, 256u}) {
        DeviceArray<float> x(h.size()), out(blocks);
        cudaMemcpy(x.p, h.data(), h.size() * 4, cudaMemcpyHostToDevice);
        launch("block_reduce", block_reduce, dim3(blocks), dim3(threads), 0, nullptr, x.p, out.p, n);
        const auto r = out.get();
        for (int b = 0; b < blocks; ++b) {
          double expect = 0;
          for (int i = 0; i < n; ++i) expect += h[b * n + i];
          EXPECT_EQ(r[b], expect) << order << " workers " << workers << " threads " << threads << " block " << b;
        }
      }
    }
}

TEST(CudaEmulation, AGlobalMemoryRaceIsCaughtByTheFiberOrders) {
#if defined(__SANITIZE_THREAD__) && !defined(MULTINORM_EMU_RACECHECK)
  // The kernel races on purpose; under TSan (scripts/sanitize.sh tsan) the race itself is reported:
  // run with MULTINORM_TSAN_SEEDED_RACE=1 to see that report.
  if (!std::getenv("MULTINORM_TSAN_SEEDED_RACE")) GTEST_SKIP() << "a deliberate race: TSan reports it";
#endif
  int wrong_forward = 0, wrong_random = 0;
  for (const char* order : {"forward", "random"}) {
    EmuEnv env(order, "2");
    DeviceArray<float> out(64), scratch(64, -1.0f);
    launch("neighbour", neighbour, dim3(1), dim3(64), 0, nullptr, out.p, scratch.p, false);
    const auto r = out.get();
    int wrong = 0;
    for (int t = 0; t < 64; ++t) wrong += !(r[t] == float((t + 1) % 64));
    (std::string(order) == "forward" ? wrong_forward : wrong_random) = wrong;
    // With the barrier every order is right.
    launch("neighbour", neighbour, dim3(1), dim3(64), 0, nullptr, out.p, scratch.p, true);
    const auto ok = out.get();
    for (int t = 0; t < 64; ++t) EXPECT_EQ(ok[t], float((t + 1) % 64)) << order;
  }
  // Forward order: each thread finishes before its right neighbour writes: 63 of 64 wrong.
  EXPECT_EQ(wrong_forward, 63);
  EXPECT_GT(wrong_random, 0);

  // Several orders per launch: the race is an error naming the kernel and the first differing byte;
  // the kernel with its barrier passes under all four orders.
  ScopedEnv orders("MULTINORM_EMU_ORDERS", "forward,reverse,random,interleaved");
  DeviceArray<float> out(64), scratch(64, -1.0f);
  std::string e = error_of([&] { launch("neighbour", neighbour, dim3(1), dim3(64), 0, nullptr, out.p, scratch.p, false); });
  EXPECT_NE(e.find("neighbour"), std::string::npos) << e;
  EXPECT_NE(e.find("depends on the execution order"), std::string::npos) << e;
  EXPECT_NE(e.find("forward and reverse"), std::string::npos) << e;
  EXPECT_EQ(error_of([&] { launch("neighbour", neighbour, dim3(1), dim3(64), 0, nullptr, out.p, scratch.p, true); }), "");
  // Blocks that read each other's results: the reversed block order changes them.
  DeviceArray<float> chain(9, 0.0f);
  e = error_of([&] { launch("chained_blocks", chained_blocks, dim3(8), dim3(32), 0, nullptr, chain.p); });
  EXPECT_NE(e.find("chained_blocks"), std::string::npos) << e;
  EXPECT_NE(e.find("depends on the execution order"), std::string::npos) << e;
}

TEST(CudaEmulation, RacecheckNamesBothThreadsOfASharedMemoryRace) {
  if (!kRacecheck) GTEST_SKIP() << "built without racecheck's instrumentation (a sanitizer build)";
  DeviceArray<float> out(64);
  for (const char* order : {"forward", "reverse", "random", "interleaved"}) {
    EmuEnv env(order, "2");
    const std::string e = error_of([&] { launch("shared_neighbour_race", shared_neighbour_race, dim3(3), dim3(64), 0, nullptr, out.p, false); });
    EXPECT_NE(e.find("shared_neighbour_race"), std::string::npos) << order << ": " << e;
    EXPECT_NE(e.find("shared-memory race"), std::string::npos) << order << ": " << e;
    EXPECT_NE(e.find("block ("), std::string::npos) << order << ": " << e;
    // the variable by name, and both threads: the one running and the other
    EXPECT_NE(e.find("shared_neighbour_race(float*, bool)::s + "), std::string::npos) << order << ": " << e;
    EXPECT_NE(e.find(") thread ("), std::string::npos) << order << ": " << e;
    EXPECT_NE(e.find("which thread ("), std::string::npos) << order << ": " << e;
    // With the second barrier the same kernel is clean and right.
    EXPECT_EQ(error_of([&] { launch("shared_neighbour_race", shared_neighbour_race, dim3(3), dim3(64), 0, nullptr, out.p, true); }), "") << order;
    const auto r = out.get();
    for (int t = 0; t < 64; ++t) EXPECT_EQ(r[t], float((t + 1) % 64 + 1)) << order;
  }
  // The same race with the checks off runs silently: what racecheck adds.
  ScopedEnv off("MULTINORM_EMU_RACECHECK", "0");
  EXPECT_EQ(error_of([&] { launch("shared_neighbour_race", shared_neighbour_race, dim3(1), dim3(64), 0, nullptr, out.p, false); }), "");
}

TEST(CudaEmulation, WarpLevelOrderingNeedsASyncwarpNamingBothLanes) {
  if (!kRacecheck) GTEST_SKIP() << "built without racecheck's instrumentation (a sanitizer build)";
  DeviceArray<float> out(64);
  auto run = [&](int reader, int sync) {
    return error_of([&] { launch("warp_handoff", warp_handoff, dim3(1), dim3(32), 0, nullptr, out.p, reader, sync); });
  };
  for (const char* order : {"forward", "reverse", "interleaved"}) {
    EmuEnv env(order, "1");
    // Nothing between the write and the read: a race in one order, an uninitialised read in another.
    const std::string none = run(1, 0);
    EXPECT_TRUE(none.find("shared-memory race") != std::string::npos || none.find("uninitialised") != std::string::npos) << order << ": " << none;
    // A shuffle does not order memory (the programming guide promises it of __syncwarp only).
    const std::string shuffle = run(1, 1);
    EXPECT_TRUE(shuffle.find("shared-memory race") != std::string::npos || shuffle.find("uninitialised") != std::string::npos)
        << order << ": " << shuffle;
    EXPECT_EQ(run(1, 2), "") << order;  // __syncwarp(0x3): lanes 0 and 1 ordered
    EXPECT_EQ(run(1, 3), "") << order;  // __syncwarp(): the whole warp
    EXPECT_EQ(out.get()[1], 42.0f) << order;
    // __syncwarp(0x3) does not order lane 0 with lane 2.
    const std::string partial = run(2, 2);
    EXPECT_TRUE(partial.find("shared-memory race") != std::string::npos || partial.find("uninitialised") != std::string::npos)
        << order << ": " << partial;
  }
}

TEST(CudaEmulation, UninitialisedSharedMemoryReadsAreErrors) {
  if (!kRacecheck) GTEST_SKIP() << "built without racecheck's instrumentation (a sanitizer build)";
  DeviceArray<float> out(64);
  const std::string e =
      error_of([&] { launch("read_uninitialised", read_uninitialised, dim3(2), dim3(32), 32 * sizeof(float), nullptr, out.p); });
  EXPECT_NE(e.find("read_uninitialised"), std::string::npos) << e;
  EXPECT_NE(e.find("that no thread of this block has written"), std::string::npos) << e;
  EXPECT_NE(e.find("dynamic shared memory + "), std::string::npos) << e;
  EXPECT_NE(e.find("thread ("), std::string::npos) << e;
}

TEST(CudaEmulation, MisalignedAccessesAreErrorsAsOnTheGpu) {
  if (!kRacecheck) GTEST_SKIP() << "built without racecheck's instrumentation (a sanitizer build)";
  DeviceArray<float> out(32);
  DeviceArray<__nv_bfloat16> row(64, __float2bfloat16(1.0f));
  EXPECT_EQ(error_of([&] { launch("pack_load", pack_load, dim3(1), dim3(32), 0, nullptr, out.p, row.p, 8); }), "");
  DeviceArray<float> frow(8, 1.0f);
  EXPECT_EQ(error_of([&] { launch("float_load", float_load, dim3(1), dim3(32), 0, nullptr, out.p, frow.p, 4); }), "");
  const std::string e = error_of([&] { launch("float_load", float_load, dim3(1), dim3(32), 0, nullptr, out.p, frow.p, 2); });
  EXPECT_NE(e.find("float_load"), std::string::npos) << e;
  EXPECT_NE(e.find("block (0,0,0) thread (0,0,0): misaligned 4-byte load at 0x"), std::string::npos) << e;
  EXPECT_NE(e.find("(address % 4 = 2)"), std::string::npos) << e;
  // g++ loads the aligned pack with an aligned SSE move, which faults on the CPU too (as the GPU
  // stops the kernel): the fault report names the kernel, block, thread and racecheck's finding.
  ::testing::FLAGS_gtest_death_test_style = "threadsafe";
  EXPECT_DEATH(launch("pack_load", pack_load, dim3(1), dim3(32), 0, nullptr, out.p, row.p, 3),
               "kernel pack_load faulted .* in block \\(0,0,0\\) thread \\(0,0,0\\), after: misaligned 16-byte load at 0x[0-9a-f]+ "
               "\\(address % 16 = 6\\)");
}

// A pack that g++ copies element by element is still one 16-byte access: misaligned, an error naming
// the kernel and the thread, as cudaErrorMisalignedAddress on a GPU. (Without the pack's own check,
// Pack's copy constructor in device_utils.cuh, both launches below pass.)
TEST(CudaEmulation, KernelPacksCopiedElementByElementAreCheckedAsOneSixteenByteAccess) {
  if (!kRacecheck) GTEST_SKIP() << "built without racecheck's instrumentation (a sanitizer build)";
  DeviceArray<float> out(32);
  DeviceArray<__nv_bfloat16> row(64, __float2bfloat16(1.0f));
  EXPECT_EQ(error_of([&] { launch("kernel_pack_load", kernel_pack_load, dim3(1), dim3(32), 0, nullptr, out.p, row.p, 8); }), "");
  std::string e = error_of([&] { launch("kernel_pack_load", kernel_pack_load, dim3(1), dim3(32), 0, nullptr, out.p, row.p, 1); });
  EXPECT_NE(e.find("kernel_pack_load"), std::string::npos) << e;
  EXPECT_NE(e.find("thread (0,0,0): misaligned 16-byte load at 0x"), std::string::npos) << e;
  EXPECT_NE(e.find("(address % 16 = 2)"), std::string::npos) << e;
  // an assignment's source (a global pack read into shared or global memory)
  DeviceArray<multinorm::cuda::Pack<__nv_bfloat16>> packs(1);
  EXPECT_EQ(error_of([&] { launch("kernel_pack_assign", kernel_pack_assign, dim3(1), dim3(32), 0, nullptr, packs.p, row.p, 8); }), "");
  e = error_of([&] { launch("kernel_pack_assign", kernel_pack_assign, dim3(1), dim3(32), 0, nullptr, packs.p, row.p, 5); });
  EXPECT_NE(e.find("misaligned 16-byte load at 0x"), std::string::npos) << e;
  EXPECT_NE(e.find("(address % 16 = 10)"), std::string::npos) << e;
  EXPECT_EQ(error_of([&] { launch("kernel_pack_store", kernel_pack_store, dim3(1), dim3(32), 0, nullptr, row.p, 16); }), "");
  e = error_of([&] { launch("kernel_pack_store", kernel_pack_store, dim3(1), dim3(32), 0, nullptr, row.p, 3); });
  EXPECT_NE(e.find("misaligned 16-byte store at 0x"), std::string::npos) << e;
  EXPECT_NE(e.find("(address % 16 = 6)"), std::string::npos) << e;
}

TEST(CudaEmulation, DeviceMemoryIsGuardedAndPoisoned) {
  // An allocation ends against an inaccessible page: a write one element past it faults at once,
  // and the report names the kernel, block and thread (what compute-sanitizer's memcheck reports).
  DeviceArray<float> x(1024);
  float* fresh = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&fresh), 100 * sizeof(float)), cudaSuccess);
  std::vector<float> h(100);
  cudaMemcpy(h.data(), fresh, 400, cudaMemcpyDeviceToHost);
  for (float v : h) EXPECT_TRUE(std::isnan(v));  // never written: NaN
  EXPECT_EQ(reinterpret_cast<uintptr_t>(fresh) % 256, 0u);
  cudaFree(fresh);
  EXPECT_EQ(cudaFree(fresh), cudaErrorInvalidValue);  // a double free is refused
  cudaGetLastError();
  ::testing::FLAGS_gtest_death_test_style = "threadsafe";
  EXPECT_DEATH(launch("write_past_the_end", write_past_the_end, dim3(9), dim3(128), 0, nullptr, x.p, 1024),
               "kernel write_past_the_end faulted \\(signal 11, address 0x[0-9a-f]+\\) in block \\(8,0,0\\) thread \\(0,0,0\\)");
  EXPECT_EQ(error_of([&] { launch("write_past_the_end", write_past_the_end, dim3(8), dim3(128), 0, nullptr, x.p, 1023); }), "");
}

// What the GPU found that the emulator let through (a test handed the CUDA backend a host array where
// the seam says backend memory, and the kernel wrote to the host's stack): a host pointer is refused
// as a kernel argument, as a copy's device side, and where a kernel reaches it through a descriptor;
// each error names the kernel (or call), the argument or the thread, and the address.
TEST(CudaEmulation, AHostStackPointerAsAKernelArgumentFailsTheLaunch) {
  DeviceArray<float> in(64, 1.0f), out(64);
  EXPECT_EQ(error_of([&] { launch("doubled", doubled, dim3(1), dim3(64), 0, nullptr, out.p, in.p, 64); }), "");
  EXPECT_EQ(out.get(), std::vector<float>(64, 2.0f));
  float on_stack[64] = {};
  const std::string e = error_of([&] { launch("doubled", doubled, dim3(1), dim3(64), 0, nullptr, on_stack, in.p, 64); });
  EXPECT_NE(e.find("CUDA kernel doubled"), std::string::npos) << e;
  EXPECT_NE(e.find("argument 0 (float*) is 0x"), std::string::npos) << e;
  EXPECT_NE(e.find("host memory (not a device allocation, not pinned)"), std::string::npos) << e;
  EXPECT_EQ(on_stack[0], 0.0f) << "refused before any thread ran";
  // The same for a read-only argument, and for a pointer into a freed allocation.
  std::vector<float> heap(64, 1.0f);
  const std::string r = error_of([&] { launch("doubled", doubled, dim3(1), dim3(64), 0, nullptr, out.p, heap.data(), 64); });
  EXPECT_NE(r.find("argument 1 (float const*) is 0x"), std::string::npos) << r;
  float* freed = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&freed), 256), cudaSuccess);
  cudaFree(freed);
  const std::string f = error_of([&] { launch("doubled", doubled, dim3(1), dim3(64), 0, nullptr, freed, in.p, 64); });
  EXPECT_NE(f.find("argument 0 (float*)"), std::string::npos) << f;
  EXPECT_NE(f.find("in no live allocation"), std::string::npos) << f;
  // Null, one past an allocation's end (an empty tensor's pointer) and pinned host memory are fine.
  EXPECT_EQ(error_of([&] { launch("doubled", doubled, dim3(1), dim3(64), 0, nullptr, out.p + 64, in.p + 64, 0); }), "");
  float* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(reinterpret_cast<void**>(&pinned), 64 * sizeof(float)), cudaSuccess);
  EXPECT_EQ(error_of([&] { launch("doubled", doubled, dim3(1), dim3(64), 0, nullptr, pinned, in.p, 64); }), "");
  EXPECT_EQ(pinned[63], 2.0f);
  cudaFreeHost(pinned);
}

TEST(CudaEmulation, AHostPointerInsideADescriptorFailsTheLaunchWhereAThreadReachesIt) {
  if (!kRacecheck) GTEST_SKIP() << "built without racecheck's instrumentation (a sanitizer build)";
  DeviceArray<float> a(100, 1.0f);
  std::vector<float> host(50, 1.0f);
  std::vector<ScaleItem> items = {{a.p, 100}, {a.p, 100}};
  DeviceArray<ScaleItem> table(items);
  EXPECT_EQ(error_of([&] { launch("scale_items", scale_items, dim3(2), dim3(64), 0, nullptr, table.p, 2); }), "");
  EXPECT_EQ(a.get()[99], 9.0f);
  items[1] = {host.data(), 50};  // the planted bug: a host array in the table
  DeviceArray<ScaleItem> planted(items);
  const std::string e = error_of([&] { launch("scale_items", scale_items, dim3(2), dim3(64), 0, nullptr, planted.p, 2); });
  EXPECT_NE(e.find("CUDA kernel scale_items"), std::string::npos) << e;
  EXPECT_NE(e.find("block (1,0,0) thread ("), std::string::npos) << e;
  EXPECT_NE(e.find("4-byte load at 0x"), std::string::npos) << e;
  EXPECT_NE(e.find("host memory (not a device allocation, not pinned)"), std::string::npos) << e;
  EXPECT_NE(e.find("cudaErrorIllegalAddress"), std::string::npos) << e;
  // A thread's own local array is on its stack: reachable.
  DeviceArray<float> out(32);
  EXPECT_EQ(error_of([&] { launch("local_array", local_array, dim3(1), dim3(32), 0, nullptr, out.p); }), "");
  const std::vector<float> local = out.get();
  for (int t = 0; t < 32; ++t) EXPECT_EQ(local[t], float((t * 23) % 32 + t)) << t;  // slot t holds k + t with 7 k = t mod 32: k = 23 t
}

TEST(CudaEmulation, APinnedFlagReadByEveryThreadIsAnError) {
  if (!kRacecheck) GTEST_SKIP() << "built without racecheck's instrumentation (a sanitizer build)";
  unsigned* flag = nullptr;
  ASSERT_EQ(cudaMallocHost(reinterpret_cast<void**>(&flag), sizeof(unsigned)), cudaSuccess);
  *flag = 2;
  DeviceArray<float> out(4 * 256, 0.0f);
  // thread 0 of 4 blocks: 4 loads of the address, fine; 256 threads of 4 blocks: the 65th load fails
  EXPECT_EQ(error_of([&] { launch("read_pinned_flag", read_pinned_flag, dim3(4), dim3(256), 0, nullptr, out.p, flag, false); }), "");
  EXPECT_EQ(out.get()[256], 2.0f);
  const std::string e = error_of([&] { launch("read_pinned_flag", read_pinned_flag, dim3(4), dim3(256), 0, nullptr, out.p, flag, true); });
  EXPECT_NE(e.find("CUDA kernel read_pinned_flag"), std::string::npos) << e;
  EXPECT_NE(e.find("load of pinned host memory at 0x"), std::string::npos) << e;
  EXPECT_NE(e.find("the 65th of that address in this launch"), std::string::npos) << e;
  cudaFreeHost(flag);
}

TEST(CudaEmulation, AHostPointerAsACopysDeviceSideIsAnErrorNamingIt) {
  DeviceArray<float> dev(4, 0.0f);
  std::vector<float> host(4, 1.0f), other(4);
  EXPECT_EQ(cudaMemcpy(dev.p, host.data(), 16, cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(other.data(), host.data(), 16, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
  std::string e = cudaGetErrorString(cudaGetLastError());
  EXPECT_NE(e.find("HostToDevice of 16 bytes: the destination should be device memory"), std::string::npos) << e;
  EXPECT_NE(e.find("host memory (not a device allocation, not pinned)"), std::string::npos) << e;
  EXPECT_EQ(cudaMemcpy(other.data(), host.data(), 16, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
  e = cudaGetErrorString(cudaGetLastError());
  EXPECT_NE(e.find("DeviceToHost of 16 bytes: the source should be device memory"), std::string::npos) << e;
  // A device side that runs past its allocation (rounded up to 256 bytes, as cudaMalloc's) is not
  // device memory holding all the bytes.
  EXPECT_EQ(cudaMemcpy(dev.p + 62, host.data(), 16, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
  e = cudaGetErrorString(cudaGetLastError());
  EXPECT_NE(e.find("device allocation 0x"), std::string::npos) << e;
  EXPECT_EQ(cudaMemsetAsync(host.data(), 0, 16, nullptr), cudaErrorInvalidValue);
  e = cudaGetErrorString(cudaGetLastError());
  EXPECT_NE(e.find("cudaMemsetAsync of 16 bytes: the destination 0x"), std::string::npos) << e;
  // Device and host addresses come from separate ranges: no host allocation lands in the device's.
  const char* lo = nullptr;
  size_t bytes = 0;
  cuda_emu::device::range(&lo, &bytes);
  for (const void* h : {static_cast<const void*>(host.data()), static_cast<const void*>(&bytes), static_cast<const void*>(&lo)})
    EXPECT_FALSE(static_cast<const char*>(h) >= lo && static_cast<const char*>(h) < lo + bytes);
  EXPECT_TRUE(reinterpret_cast<const char*>(dev.p) >= lo && reinterpret_cast<const char*>(dev.p) < lo + bytes);
}

TEST(CudaEmulation, OrdersRunFibersAndBlocksAsNamed) {
  DeviceArray<int> first(64 * 4), counter(1, 0);
  auto tickets_of = [&](const char* order) {
    EmuEnv env(order, "1");
    cudaMemsetAsync(counter.p, 0, 4, nullptr);
    launch("tickets", tickets, dim3(4), dim3(64), 0, nullptr, first.p, counter.p);
    return first.get();
  };
  const auto fwd = tickets_of("forward"), rev = tickets_of("reverse"), inter = tickets_of("interleaved"), rnd = tickets_of("random");
  EXPECT_EQ(fwd[1], 1);                  // thread 1 of block 0 second
  EXPECT_EQ(rev[3 * 64 + 63], 0);        // block 3's last thread first
  EXPECT_EQ(inter[32], 1);               // warp 1's lane 0 right after warp 0's lane 0
  EXPECT_EQ(inter[1], 2);
  std::vector<int> sorted = rnd;
  std::sort(sorted.begin(), sorted.end());
  for (int k = 0; k < 256; ++k) EXPECT_EQ(sorted[k], k);  // a permutation,
  EXPECT_NE(rnd, fwd);                                     // not the forward one
}

TEST(CudaEmulation, MisuseIsAnErrorNamingTheKernel) {
  DeviceArray<float> out(64);
  std::string e = error_of([&] { launch("divergent_barrier", divergent_barrier, dim3(1), dim3(64), 0, nullptr, out.p); });
  EXPECT_NE(e.find("divergent_barrier"), std::string::npos) << e;
  EXPECT_NE(e.find("__syncthreads"), std::string::npos) << e;
  e = error_of([&] { launch("shuffle_with_exited_lane", shuffle_with_exited_lane, dim3(1), dim3(32), 0, nullptr, out.p); });
  EXPECT_NE(e.find("exited"), std::string::npos) << e;
  e = error_of([&] { launch("disagreeing_masks", disagreeing_masks, dim3(1), dim3(32), 0, nullptr, out.p); });
  EXPECT_NE(e.find("disagree"), std::string::npos) << e;
  e = error_of([&] { launch("block_reduce", block_reduce, dim3(1), dim3(48), 0, nullptr, out.p, out.p, 1); });
  EXPECT_NE(e.find("do not exist"), std::string::npos) << "a full mask in a 48-thread block names lanes 48..63: " << e;
  e = error_of([&] { launch("do_nothing", do_nothing, dim3(1), dim3(2048), 0, nullptr); });
  EXPECT_NE(e.find("1..1024"), std::string::npos) << e;
  e = error_of([&] { launch("do_nothing", do_nothing, dim3(0), dim3(32), 0, nullptr); });
  EXPECT_NE(e.find("empty grid"), std::string::npos) << e;
  e = error_of([&] { launch("do_nothing", do_nothing, dim3(1, 65536), dim3(32), 0, nullptr); });
  EXPECT_NE(e.find("at most 65535"), std::string::npos) << e;
  DeviceArray<unsigned> votes(32);
  e = error_of([&] { launch("divergent_ballot", divergent_ballot, dim3(1), dim3(32), 0, nullptr, votes.p); });
  EXPECT_NE(e.find("divergent_ballot"), std::string::npos) << e;
  EXPECT_NE(e.find("different warp collectives"), std::string::npos) << e;
}

TEST(CudaEmulation, ShufflesAndVotesFollowTheProgrammingGuide) {
  DeviceArray<int> up(32), down(32), xr(32), idx(32), any(32), all(32);
  DeviceArray<unsigned> ballot(32);
  launch("shuffles", shuffles, dim3(1), dim3(32), 0, nullptr, up.p, down.p, xr.p, idx.p, ballot.p, any.p, all.p);
  const auto u = up.get(), d = down.get(), x = xr.get(), i = idx.get(), a = any.get(), l = all.get();
  const auto b = ballot.get();
  unsigned expect_ballot = 0;
  for (int lane = 0; lane < 32; lane += 3) expect_ballot |= 1u << lane;
  for (int lane = 0; lane < 32; ++lane) {
    const int seg = lane & ~7;
    EXPECT_EQ(u[lane], lane - 3 < seg ? lane : lane - 3) << lane;    // below the segment: own value
    EXPECT_EQ(d[lane], lane + 3 >= seg + 8 ? lane : lane + 3) << lane;  // past the segment: own value
    EXPECT_EQ(x[lane], lane ^ 5) << lane;
    EXPECT_EQ(i[lane], seg + 1) << lane;
    EXPECT_EQ(b[lane], expect_ballot);
    EXPECT_EQ(a[lane], 1);
    EXPECT_EQ(l[lane], 0);
  }
}

TEST(CudaEmulation, AtomicsAreExactAcrossWorkerThreads) {
  EmuEnv env("random", "4");
  DeviceArray<int> counter(1, 0);
  DeviceArray<float> fsum(1, 0.0f);
  launch("count_atomically", count_atomically, dim3(64), dim3(128), 0, nullptr, counter.p, fsum.p);
  EXPECT_EQ(counter.get()[0], 64 * 128);
  EXPECT_EQ(fsum.get()[0], 64.0f * 128.0f);  // integers below 2^24: exact in any order
}

TEST(CudaEmulation, DynamicSharedMemoryStartsAsNaN) {
  ScopedEnv off("MULTINORM_EMU_RACECHECK", "0");  // with the checks on, the read itself is an error
  DeviceArray<float> out(64);
  launch("read_uninitialised", read_uninitialised, dim3(2), dim3(32), 32 * sizeof(float), nullptr, out.p);
  for (float v : out.get()) EXPECT_TRUE(std::isnan(v));
}

// Stream capture as a GPU does it: a copy from pageable memory is refused (the driver stages it at
// the call, so a graph cannot repeat it) and invalidates the capture; a copy from pinned memory is
// recorded and reads the pinned bytes when the graph runs, not when it was captured: why the backend
// refuses to_device while capturing (a replay would copy whatever its pinned upload ring holds then).
TEST(CudaEmulation, CaptureRefusesPageableCopiesAndReplaysPinnedOnesFromTheirBytesThen) {
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  DeviceArray<float> dev(4, 0.0f);
  std::vector<float> pageable = {1, 2, 3, 4};
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  EXPECT_EQ(cudaMemcpyAsync(dev.p, pageable.data(), 16, cudaMemcpyHostToDevice, stream), cudaErrorStreamCaptureUnsupported);
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(stream, &graph), cudaErrorStreamCaptureInvalidated);
  cudaGetLastError();
  float* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(reinterpret_cast<void**>(&pinned), 16), cudaSuccess);
  std::copy(pageable.begin(), pageable.end(), pinned);
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(dev.p, pinned, 16, cudaMemcpyHostToDevice, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  EXPECT_EQ(dev.get(), std::vector<float>(4, 0.0f)) << "a captured copy ran";
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  pinned[0] = 9;  // after the capture, before the replay
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  EXPECT_EQ(dev.get(), (std::vector<float>{9, 2, 3, 4}));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaFreeHost(pinned);
  cudaStreamDestroy(stream);
}

// A device loop as the backend captures it (CudaQueue::device_loop): a WHILE node added to the
// capture, its body captured on a second stream into the node's graph. The body's kernel counts and
// clears the condition at `limit`: each launch of the graph runs it `limit` times (the default, 1, is
// assigned at every launch), and work captured after the node runs after the loop. A body that never
// clears its condition is an error naming it, not a hang.
__global__ void count_until(int* counter, int limit, cudaGraphConditionalHandle loop) {
  counter[0] += 1;
  cudaGraphSetConditional(loop, limit == 0 || counter[0] % limit != 0 ? 1u : 0u);
}
__global__ void copy_first(int* out, const int* in) { out[0] = in[0]; }

TEST(CudaEmulation, WhileNodeRunsItsBodyUntilAKernelClearsTheCondition) {
  cudaStream_t stream = nullptr, body_stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&body_stream, cudaStreamNonBlocking), cudaSuccess);
  for (const int limit : {5, 0}) {  // 0: never cleared
    DeviceArray<int> counter(1, 0), after(1, -1);
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    cudaGraph_t graph = nullptr;
    cudaStreamCaptureStatus status{};
    ASSERT_EQ(cudaStreamGetCaptureInfo(stream, &status, nullptr, &graph, nullptr, nullptr, nullptr), cudaSuccess);
    ASSERT_EQ(status, cudaStreamCaptureStatusActive);
    cudaGraphConditionalHandle handle = 0;
    ASSERT_EQ(cudaGraphConditionalHandleCreate(&handle, graph, 1, cudaGraphCondAssignDefault), cudaSuccess);
    cudaGraphNodeParams params{};
    params.type = cudaGraphNodeTypeConditional;
    params.conditional.handle = handle, params.conditional.type = cudaGraphCondTypeWhile, params.conditional.size = 1;
    cudaGraphNode_t node = nullptr;
    ASSERT_EQ(cudaGraphAddNode(&node, graph, nullptr, nullptr, 0, &params), cudaSuccess);
    ASSERT_EQ(cudaStreamUpdateCaptureDependencies(stream, &node, nullptr, 1, cudaStreamSetCaptureDependencies), cudaSuccess);
    ASSERT_EQ(cudaStreamBeginCaptureToGraph(body_stream, params.conditional.phGraph_out[0], nullptr, nullptr, 0, cudaStreamCaptureModeThreadLocal),
              cudaSuccess);
    launch("count_until", count_until, dim3(1), dim3(1), 0, body_stream, counter.p, limit, handle);
    cudaGraph_t body = nullptr;
    ASSERT_EQ(cudaStreamEndCapture(body_stream, &body), cudaSuccess);
    launch("copy_first", copy_first, dim3(1), dim3(1), 0, stream, after.p, counter.p);
    ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
    EXPECT_EQ(counter.get()[0], 0) << "captured work ran";
    cudaGraphExec_t exec = nullptr;
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    cudaGraphDestroy(graph);  // the instantiated graph keeps the body
    if (limit == 0) {
      std::string error;
      try {
        cudaGraphLaunch(exec, stream);
      } catch (const std::exception& e) {
        error = e.what();
      }
      EXPECT_NE(error.find("nothing cleared its condition"), std::string::npos) << error;
    } else {
      const int64_t bodies = cuda_emu::conditional_bodies();
      for (int launch_no = 1; launch_no <= 2; ++launch_no) {
        ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
        EXPECT_EQ(counter.get()[0], limit * launch_no);
        EXPECT_EQ(after.get()[0], limit * launch_no) << "the work after the node ran after the loop";
      }
      EXPECT_EQ(cuda_emu::conditional_bodies() - bodies, 2 * limit);
    }
    cudaGraphExecDestroy(exec);
  }
  cudaStreamDestroy(body_stream);
  cudaStreamDestroy(stream);
}

// The pinned staging rings' bookkeeping (kernels/cuda/ring_spans.h): spans handed out in order and
// given back oldest first never overlap a span still held and stay inside the ring, whatever the
// sizes (those of a training run: tokens, targets, a mask and a small struct, in turn); a ring given
// everything back hands out its whole capacity. A planted ring that, on wrapping, frees spans only
// while the oldest overlaps (the first upload ring did) hands out bytes a pending copy still reads:
// 13,328 times in 20,000 here, which the check counts.
TEST(RingSpans, SpansHeldNeverOverlapAndTheRingIsReused) {
  using multinorm::cuda::RingSpans;
  struct Span {
    int64_t begin, end;
  };
  auto overlaps = [](const std::deque<Span>& held, int64_t b, int64_t e) {
    for (const Span& s : held)
      if (s.begin < e && b < s.end) return true;
    return false;
  };
  // The ring of the project and the planted one, driven alike: returns the overlaps seen. A 32 KiB
  // ring, six copies in flight (the device that far behind), the sizes varying so that one pass round
  // the ring ends before the previous one did.
  auto drive = [&](bool planted) {
    const int64_t capacity = 32 * 1024;
    const size_t in_flight = 6;
    RingSpans ring(capacity);
    std::deque<Span> held;
    int64_t planted_head = 0, overlaps_seen = 0, taken = 0;
    const int64_t sizes[] = {16384, 16384, 4096, 256, 12544, 12544, 3328};
    for (int i = 0; i < 20000; ++i) {
      const int64_t bytes = sizes[i % 7] + 256 * (i % 3);
      while (held.size() > in_flight) {  // the device completes the oldest copies
        held.pop_front();
        if (!planted) ring.give_back_oldest();
      }
      int64_t begin = -1;
      if (planted) {  // the first upload ring: wrap, then wait only while the oldest span overlaps
        if (planted_head + bytes > capacity) planted_head = 0;
        while (!held.empty() && held.front().begin < planted_head + bytes && planted_head < held.front().end) held.pop_front();
        begin = planted_head, planted_head += bytes;
      } else {
        while ((begin = ring.take(bytes)) < 0 && !held.empty()) held.pop_front(), ring.give_back_oldest();
        EXPECT_GE(begin, 0) << "an empty ring refused " << bytes << " bytes";
      }
      EXPECT_LE(begin + bytes, capacity);
      overlaps_seen += overlaps(held, begin, begin + bytes);
      held.push_back({begin, begin + bytes});
      ++taken;
    }
    EXPECT_EQ(taken, 20000);
    return overlaps_seen;
  };
  EXPECT_EQ(drive(false), 0) << "a span handed out over one still held";
  EXPECT_GT(drive(true), 0) << "the planted ring's overlaps went unseen";
  RingSpans ring(1024);
  EXPECT_EQ(ring.take(1024), 0);
  EXPECT_EQ(ring.take(1), -1);
  ring.give_back_oldest();
  EXPECT_EQ(ring.take(512), 0);
  EXPECT_EQ(ring.take(512), 512);
  EXPECT_EQ(ring.take(256), -1) << "full";
  ring.give_back_oldest();
  EXPECT_EQ(ring.take(256), 0) << "wrapped into the room the oldest gave back";
  EXPECT_EQ(ring.take(256), 256);
  EXPECT_EQ(ring.take(1), -1) << "between the newest and the oldest: none";
}

extern "C" int multinorm_cuda_environment(char* out, size_t len);

// The environment probe visits every GPU; a backend's device (here 2 of 3) stays the current one.
TEST(CudaEnvironment, TheProbeLeavesTheCurrentDeviceAsItWas) {
  cuda_emu::set_device_count_for_test(3);
  ASSERT_EQ(cudaSetDevice(2), cudaSuccess);
  std::vector<char> out(1 << 16);
  ASSERT_EQ(multinorm_cuda_environment(out.data(), out.size()), 0);
  EXPECT_NE(std::string(out.data()).find("\"index\": 2"), std::string::npos) << out.data();  // it visited device 2
  int device = -1;
  EXPECT_EQ(cudaGetDevice(&device), cudaSuccess);
  EXPECT_EQ(device, 2);
  cuda_emu::set_device_count_for_test(0);
}
