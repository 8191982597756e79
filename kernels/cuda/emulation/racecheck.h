// The emulated build's memory checker, what compute-sanitizer's racecheck and part of memcheck do on
// a GPU. The kernel sources are compiled with GCC's ThreadSanitizer instrumentation
// (-fsanitize=thread), which calls a hook before every load and store; racecheck.cpp implements those
// hooks itself (no TSan runtime is linked) and, while an emulated CUDA thread runs, checks:
//   - alignment: an access the compiler knows to be N-byte aligned (a float, a 16-byte Pack) at an
//     address that is not: a GPU stops the kernel with cudaErrorMisalignedAddress;
//   - shared-memory races: a shared byte written by one thread and read or written by another with
//     neither a __syncthreads nor a __syncwarp naming both lanes between them (warp-level ordering
//     is tracked with a vector clock per lane; shuffles and votes do not order memory, as the CUDA
//     programming guide says);
//   - uninitialised shared memory: a read of a shared byte no thread of the block has written;
//   - cp.async: a read or write of shared bytes a cp.async is still copying into (it lands only at a
//     cp.async.wait_group that lets it, cuda_emulation.h), and a copy issued over bytes another
//     thread read since the last barrier;
//   - reach: a load, store or atomic outside shared memory must be device memory (a live allocation of
//     device_memory.h), pinned host memory, or the thread's own stack (its local arrays): any other host
//     address (a pointer to the host's stack or heap reached through an argument or a descriptor)
//     faults on a GPU with cudaErrorIllegalAddress. Checked from the moment the thread enters the
//     kernel's code (kernel_entry: before it, the emulation copies the arguments from host memory).
//   - pinned host memory read over and over: one address loaded more than 64 times in a launch (a
//     flag every thread reads) is an error, each such load being a PCIe round trip on a GPU.
// The first error of a block is kept and reported by the scheduler with the kernel, block and thread.
//
// MULTINORM_EMU_RACECHECK=0 turns the checks off (the hooks then return at once). The sanitizer
// builds (scripts/sanitize.sh) compile without this instrumentation: ASan cannot be combined with it,
// and TSan is then the real thing.
//
// The scheduler's side (cuda_emulation.cpp), all on the worker thread that runs the block:
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace cuda_emu::racecheck {

// A launch of `kernel` starts and ends (on the launching thread): reads MULTINORM_EMU_RACECHECK, and
// installs (once) a SIGSEGV/SIGBUS reporter that names the kernel, block and thread of a fault.
// `journal`: the hooks feed the device memory's write journal (device_memory.h) even with the
// checks off.
void begin_launch(const char* kernel, bool journal);
void end_launch();
// Whether this module's kernels carry the instrumentation (their hooks are these).
bool instrumented();
void mark_instrumented();

// A worker thread's state (racecheck.cpp).
struct Worker;
// A block starts on this worker: its shape, its dynamic shared memory. Returns the worker's state,
// which the scheduler hands to the calls it makes on every switch (a thread-local lookup in a shared
// library is a call into the dynamic linker: once a block, not twice a switch).
Worker& begin_block(uint3 block_idx, dim3 block, void* dynamic_shared, size_t dynamic_bytes);
Worker& this_worker();
// The CUDA thread (linear index in the block) the worker is about to run, and back to the scheduler.
// `view` (owned by the scheduler's fiber) says where its stack is and whether it is in the kernel's
// code yet.
struct ThreadView {
  const char* stack_lo = nullptr;
  size_t stack_bytes = 0;
  // The emulation's state the thread's code reads on every threadIdx / blockDim (its fiber, its
  // block) and after a warp-matrix instruction (its warp's last exchange): reachable, checked inline.
  const char* state_lo[3] = {nullptr, nullptr, nullptr};
  size_t state_bytes[3] = {0, 0, 0};
  bool in_kernel = false;
};
void enter_thread(Worker& w, int linear, const ThreadView* view);
void leave_thread(Worker& w);
// cp.async: the running thread issued a copy into shared memory [p, p + size) (checked as a write;
// then a read or write of those bytes is an error until it lands), and it landed.
void async_copy_issued(const void* p, size_t size);
void async_copy_landed(const void* p, size_t size);
// Every thread of the block passed a __syncthreads.
void barrier_completed();
// The lanes of `mask` in warp `warp` completed a __syncwarp together.
void warp_synced(int warp, unsigned mask);
// Moves the first error found in this worker's current block into *what and clears it; false (and
// *what untouched) when there is none: the scheduler asks after every switch.
bool take_error(Worker& w, std::string* what);

}  // namespace cuda_emu::racecheck
