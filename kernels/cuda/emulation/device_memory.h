// The emulated device's memory (cudaMalloc/cudaFree of cuda_runtime_emulation.cpp), the pinned host
// allocations (cudaMallocHost), and what a launch run under several fiber orders needs to restore and
// compare device memory.
//
// The emulated address space: device allocations come from one reserved address range of their own,
// which no host allocation can share, so a pointer is device memory or host memory, never both; a
// kernel may reach only device allocations and pinned host memory (as on a GPU, where any other host
// address faults): the launch checks its pointer arguments (cuda_compat.h) and racecheck every access
// (racecheck.h), each naming the kernel and the address, classified by describe().
//
// Allocations come from the reserved range, each on pages of its own between two
// inaccessible guard pages, its end against the upper guard (the base 256-byte aligned, as
// cudaMalloc's): a kernel reading or writing past an allocation faults at once, and the fault report
// names the kernel, block and thread (racecheck.cpp). Fresh memory is poisoned with 0xff bytes
// (NaN as float and bf16), as a GPU's is garbage. Freed pages go back to the OS.
//
// The write journal: while it is on, the instrumented kernels' stores (racecheck's hooks) save each
// device page's contents before its first store, so a launch can be undone and its writes compared
// page by page, at a cost proportional to what it wrote.
#pragma once
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace cuda_emu {

namespace device {

// A poisoned allocation of `bytes`, or nullptr when the emulated device's memory is exhausted.
void* allocate(size_t bytes);
// False when p is not the base of a live allocation.
bool release(void* p);
// Whether [p, p + bytes) lies inside one live allocation.
bool contains(const void* p, size_t bytes);
size_t bytes_in_use();
size_t capacity();
// The reserved range [*begin, *begin + *bytes) that holds every device allocation (and nothing else).
void range(const char** begin, size_t* bytes);

// Pinned host memory (cudaMallocHost): host memory a kernel may reach, as CUDA maps it.
void add_pinned(const void* p, size_t bytes);
void remove_pinned(const void* p);
bool is_pinned(const void* p, size_t bytes);

// What `p` is, for an error message: "device allocation 0x.. of 256 bytes, byte 16", "pinned host
// memory ...", "in the emulated device's range but in no live allocation (freed, or a guard page)",
// or "host memory (not a device allocation, not pinned)".
std::string describe(const void* p);

// Pages saved by the journal: each page's base and its contents before the first store.
struct Journal {
  std::vector<std::pair<char*, std::vector<char>>> pages;
};
void journal_begin();
Journal journal_end();
// Called before a store of `bytes` at p by kernel code; cheap unless the journal is on.
void note_write(const void* p, size_t bytes);

}  // namespace device

bool is_device_memory(const void* p, size_t bytes);
// Whether a kernel may be handed `p` (an argument, a copy's device side): nullptr, or an address in a
// live device allocation or pinned host memory (one past an allocation's end included: an empty range).
bool is_kernel_reachable(const void* p);

// Whole-memory images: the fallback of the several-orders check when the kernels carry no
// instrumentation (the sanitizer builds).
struct DeviceImage {
  std::vector<std::pair<char*, std::vector<char>>> allocations;  // base, contents
};
DeviceImage save_device_memory();
void restore_device_memory(const DeviceImage& image);
// "" when every range of `image` holds the same bytes now; else the first difference.
std::string compare_device_memory(const DeviceImage& image);

}  // namespace cuda_emu
