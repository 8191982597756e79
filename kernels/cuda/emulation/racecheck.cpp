// The access hooks of the instrumented kernel code and the shadow memory behind them (racecheck.h).
// This file is compiled without instrumentation.
//
// Shadow: one Cell per byte of shared memory (the worker's static __shared__ variables, which are
// the kernel module's thread-locals, and the block's dynamic shared memory). A cell remembers the
// last write and up to two reads since, each as (thread, barrier generation, the thread's warp clock).
// Two accesses are ordered when a __syncthreads lies between them (different generation), when one
// thread made both, or when both threads are lanes of one warp and a __syncwarp naming both lies
// between them (the reader's vector clock has seen the writer's clock). Cells are tagged with the
// block's serial number, so a new block starts with a clean shadow without clearing it.
//
// Cost: the hooks run on every load and store of the kernels (a few ns; ~1.3x the emulated suite's
// time), and a shared access updates its bytes' cells (48 bytes of shadow per shared byte).
#include "racecheck.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "device_memory.h"
#include "symbols.h"

namespace cuda_emu::racecheck {
namespace {

struct Access {
  uint32_t gen = 0;  // barrier generation (from 1); 0: none
  uint32_t clk = 0;  // the thread's own warp clock at the access
  uint16_t tid = 0;  // linear thread index in the block
};

struct Cell {
  uint64_t serial = 0;  // the block that last touched it; other values: the cell is empty
  Access write;
  Access read[2];
  uint8_t readers = 0;
  bool pending = false;  // the destination of a cp.async that has not landed
  uint16_t pending_tid = 0;
};

}  // namespace

struct Worker {
  int tid = -1;  // the CUDA thread running now; -1 while the scheduler runs
  const ThreadView* view = nullptr;  // its stack, and whether it is in the kernel's code
  uint3 block_idx{};
  uint64_t serial = 0;
  uint32_t gen = 1;
  dim3 dim;
  int threads = 0;
  // static __shared__: this worker's TLS block of the kernel module
  char* static_lo = nullptr;
  size_t static_bytes = 0;
  bool static_known = false;
  std::vector<Cell> static_cells;
  // dynamic shared memory of the current block
  char* dynamic_lo = nullptr;
  size_t dynamic_bytes = 0;
  std::vector<Cell> dynamic_cells;
  // vc[t * 32 + l]: what thread t knows of lane l's clock (lanes of t's own warp), reset at barriers
  std::vector<uint32_t> vc;
  std::string error;
};

namespace {

std::atomic<bool> g_active{false};  // a launch with the checks or the write journal on is running
std::atomic<bool> g_checks{false};  // ... with the checks on
bool g_instrumented = false;        // an instrumented translation unit called __tsan_init
const char* g_kernel = "";          // the running launch's kernel, for the fault report
const char* g_device_lo = nullptr;  // the emulated device's address range (device_memory.h)
size_t g_device_bytes = 0;
std::atomic<uint64_t> g_serial{0};
// Loads of pinned host memory in the running launch, per address (rare: a lock is cheap enough).
constexpr int kPinnedLoadsPerAddress = 64;  // two warps' same-address loads: two PCIe transactions
std::mutex g_pinned_mutex;
std::map<uintptr_t, int> g_pinned_loads;
thread_local Worker t_worker_state;
thread_local Worker* t_worker = nullptr;

std::string thread_name(const Worker& w, int tid) {
  const unsigned x = tid % w.dim.x, y = tid / w.dim.x % w.dim.y, z = tid / (w.dim.x * w.dim.y);
  return "thread (" + std::to_string(x) + "," + std::to_string(y) + "," + std::to_string(z) + ")";
}

std::string hex_address(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}

// "multinorm::cuda::...::kernel(...)::tile + 12 (static __shared__)" or "dynamic shared memory + 40".
std::string shared_name(bool is_static, size_t offset) {
  if (!is_static) return "dynamic shared memory + " + std::to_string(offset);
  const std::string n = symbols::tls_variable(reinterpret_cast<const void*>(&begin_block), offset);
  return (n.empty() ? "static shared memory + " + std::to_string(offset) : n) + " (static __shared__)";
}

void record_error(Worker& w, std::string what) {
  if (w.error.empty()) w.error = std::move(what);
}

bool ordered(const Worker& w, const Access& a, int tid) {
  if (a.gen != w.gen || a.tid == tid) return true;
  if (a.tid / 32 != tid / 32) return false;
  return w.vc[static_cast<size_t>(tid) * 32 + a.tid % 32] >= a.clk;
}

void shadow(Worker& w, std::vector<Cell>& cells, bool is_static, size_t offset, size_t size, bool write) {
  const int tid = w.tid;
  const Access now{w.gen, w.vc[static_cast<size_t>(tid) * 32 + tid % 32], static_cast<uint16_t>(tid)};
  for (size_t i = 0; i < size && offset + i < cells.size(); ++i) {
    Cell& c = cells[offset + i];
    if (c.serial != w.serial) c = Cell{}, c.serial = w.serial;
    if (!w.error.empty()) return;  // one report per block
    if (c.pending) {
      record_error(w, std::string(write ? "writes " : "reads ") + std::to_string(size) + " bytes at " + shared_name(is_static, offset + i) +
                          ", the destination of a cp.async " + thread_name(w, c.pending_tid) +
                          " issued that has not landed (no cp.async.wait_group let it since): a GPU sees stale or partial data");
      return;
    }
    if (write) {
      if (c.write.gen && !ordered(w, c.write, tid))
        record_error(w, "shared-memory race (write after write): writes " + std::to_string(size) + " bytes at " +
                            shared_name(is_static, offset + i) + ", which " + thread_name(w, c.write.tid) +
                            " wrote since the last __syncthreads, with no __syncthreads or __syncwarp ordering the two");
      for (int r = 0; r < c.readers; ++r)
        if (!ordered(w, c.read[r], tid))
          record_error(w, "shared-memory race (write after read): writes " + std::to_string(size) + " bytes at " +
                              shared_name(is_static, offset + i) + ", which " + thread_name(w, c.read[r].tid) +
                              " read since the last __syncthreads, with no __syncthreads or __syncwarp ordering the two");
      c.write = now;
      c.readers = 0;
    } else {
      if (!c.write.gen) {
        record_error(w, "reads " + std::to_string(size) + " bytes of shared memory at " + shared_name(is_static, offset + i) +
                            " that no thread of this block has written (uninitialised shared memory)");
      } else if (!ordered(w, c.write, tid)) {
        record_error(w, "shared-memory race (read after write): reads " + std::to_string(size) + " bytes at " +
                            shared_name(is_static, offset + i) + ", which " + thread_name(w, c.write.tid) +
                            " wrote since the last __syncthreads, with no __syncthreads or __syncwarp ordering the two");
      }
      if (c.readers && c.read[0].gen != w.gen) c.readers = 0;
      if (c.readers == 0) {
        c.read[0] = now, c.readers = 1;
      } else if (c.read[0].tid == tid) {
        c.read[0] = now;
      } else {
        c.read[1] = now, c.readers = 2;
      }
    }
  }
}

inline bool in_device_range(uintptr_t a) { return a - reinterpret_cast<uintptr_t>(g_device_lo) < g_device_bytes; }
// The thread's stack, its fiber, its block or its warp's last exchange: what a kernel's accesses
// outside shared and device memory are, but for a bug.
inline bool in_own_state(const Worker& w, uintptr_t a) {
  const ThreadView& v = *w.view;
  return a - reinterpret_cast<uintptr_t>(v.stack_lo) < v.stack_bytes || a - reinterpret_cast<uintptr_t>(v.state_lo[0]) < v.state_bytes[0] ||
         a - reinterpret_cast<uintptr_t>(v.state_lo[1]) < v.state_bytes[1] || a - reinterpret_cast<uintptr_t>(v.state_lo[2]) < v.state_bytes[2];
}

// A load of pinned host memory is a round trip over PCIe on a GPU (about a microsecond): a flag read by
// every thread of a launch made SWAN's update 25x its prediction on an H100 (2026-11-27). Loading one
// address more than kPinnedLoadsPerAddress times in a launch is an error; streaming a pinned array
// (each address once) is not.
void note_pinned_load(Worker& w, uintptr_t a) {
  int count = 0;
  {
    std::lock_guard<std::mutex> lock(g_pinned_mutex);
    count = ++g_pinned_loads[a];
  }
  if (count == kPinnedLoadsPerAddress + 1)
    record_error(w, "load of pinned host memory at " + hex_address(reinterpret_cast<const void*>(a)) + ", the " +
                        std::to_string(count) + "th of that address in this launch: on a GPU each is a round trip over PCIe " +
                        "(about a microsecond). Read it once (one thread) into device memory, and the other threads from there");
}

// An access of the kernel's code outside shared memory and the device's range: its own stack, what the
// emulation hands it (threadIdx, a warp exchange: ThreadView) and pinned host memory are reachable;
// any other address is host memory a GPU cannot reach.
void check_reach(Worker& w, const void* p, size_t size, bool write, const char* what) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  if (!w.error.empty() || in_own_state(w, a)) return;
  if (device::is_pinned(p, size)) {
    if (!write) note_pinned_load(w, a);
    return;
  }
  record_error(w, std::to_string(size) + "-byte " + what + (write ? "store" : "load") + " at " + hex_address(p) + ": " +
                      device::describe(p) +
                      ". A kernel reaches only device allocations, pinned host memory and its own stack: on a GPU this access "
                      "faults (cudaErrorIllegalAddress). A host pointer passed where device memory is expected, directly or "
                      "inside a descriptor the kernel reads?");
}

// The checks of one access: alignment, then the shadow of shared memory, or the reach of any other
// address (out of line: the hooks' fast path below stays small).
__attribute__((noinline)) void check_access(Worker* w, const void* p, size_t size, bool write, size_t align) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  if (align > 1 && (a & (align - 1)) && w->error.empty())
    record_error(*w, "misaligned " + std::to_string(size) + "-byte " + (write ? "store" : "load") + " at " + hex_address(p) +
                         " (address % " + std::to_string(align) + " = " + std::to_string(a % align) +
                         "): a GPU stops the kernel with cudaErrorMisalignedAddress");
  if (a - reinterpret_cast<uintptr_t>(w->static_lo) < w->static_bytes)
    shadow(*w, w->static_cells, true, a - reinterpret_cast<uintptr_t>(w->static_lo), size, write);
  else if (a - reinterpret_cast<uintptr_t>(w->dynamic_lo) < w->dynamic_bytes)
    shadow(*w, w->dynamic_cells, false, a - reinterpret_cast<uintptr_t>(w->dynamic_lo), size, write);
  else if (in_device_range(a)) {
    if (write) device::note_write(p, size);
  } else if (w->view && w->view->in_kernel)
    check_reach(*w, p, size, write, "");
}

inline void on_access(const void* p, size_t size, bool write, size_t align) {
  if (!g_active.load(std::memory_order_relaxed)) return;
  Worker* w = t_worker;
  if (!w || w->tid < 0) return;
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  if (g_checks.load(std::memory_order_relaxed) &&
      ((a & (align - 1)) || a - reinterpret_cast<uintptr_t>(w->static_lo) < w->static_bytes ||
       a - reinterpret_cast<uintptr_t>(w->dynamic_lo) < w->dynamic_bytes ||
       (!in_device_range(a) && w->view && w->view->in_kernel && !in_own_state(*w, a)))) {
    check_access(w, p, size, write, align);
    return;
  }
  if (write) device::note_write(p, size);  // global memory: only the write journal's business
}

// An atomic (not shadowed: atomics do not race): its reach, and its store for the write journal.
inline void on_atomic(const volatile void* v, size_t size, bool write) {
  if (!g_active.load(std::memory_order_relaxed)) return;
  Worker* w = t_worker;
  if (!w || w->tid < 0) return;
  const void* p = const_cast<const void*>(v);
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const bool shared = a - reinterpret_cast<uintptr_t>(w->static_lo) < w->static_bytes || a - reinterpret_cast<uintptr_t>(w->dynamic_lo) < w->dynamic_bytes;
  if (g_checks.load(std::memory_order_relaxed) && !shared && !in_device_range(a) && w->view && w->view->in_kernel)
    check_reach(*w, p, size, write, "atomic ");
  if (write) device::note_write(p, size);
}

void reset_clocks(Worker& w) {
  w.vc.assign(static_cast<size_t>(w.threads) * 32, 0);
  for (int t = 0; t < w.threads; ++t) w.vc[static_cast<size_t>(t) * 32 + t % 32] = 1;
}

// A kernel that faults (an out-of-bounds address, or an aligned SSE load at a misaligned address,
// after racecheck recorded it) kills the process: first say which kernel, block and thread, and the
// error racecheck recorded, then let the previous handler or the default action take over.
struct sigaction g_previous[2];
// The report is formatted without allocating (a signal handler may only make async-signal-safe
// calls: the fault may have hit inside malloc), into a fixed buffer written with write(2).
struct SignalMessage {
  char buf[1024];
  size_t n = 0;
  void text(const char* s, size_t len) {
    for (size_t i = 0; i < len && n < sizeof buf; ++i) buf[n++] = s[i];
  }
  void text(const char* s) { text(s, std::strlen(s)); }
  void number(uint64_t v, unsigned base) {
    char d[24];
    int k = 0;
    do {
      d[k++] = "0123456789abcdef"[v % base];
      v /= base;
    } while (v);
    while (k) text(&d[--k], 1);
  }
};
void on_fault(int sig, siginfo_t* info, void*) {
  Worker* w = t_worker;
  if (w && w->tid >= 0) {
    SignalMessage m;
    const unsigned tid = static_cast<unsigned>(w->tid);
    m.text("\nemulated CUDA: kernel "), m.text(g_kernel), m.text(" faulted (signal "), m.number(static_cast<unsigned>(sig), 10);
    m.text(", address 0x"), m.number(reinterpret_cast<uintptr_t>(info->si_addr), 16);
    m.text(") in block ("), m.number(w->block_idx.x, 10), m.text(","), m.number(w->block_idx.y, 10), m.text(","), m.number(w->block_idx.z, 10);
    m.text(") thread ("), m.number(tid % w->dim.x, 10), m.text(","), m.number(tid / w->dim.x % w->dim.y, 10), m.text(",");
    m.number(tid / (w->dim.x * w->dim.y), 10), m.text(")");
    if (!w->error.empty()) m.text(", after: "), m.text(w->error.data(), w->error.size());
    m.text("\n");
    if (::write(2, m.buf, m.n) < 0) m.n = 0;
  }
  sigaction(sig, &g_previous[sig == SIGSEGV ? 0 : 1], nullptr);  // the faulting access repeats and ends the process
}
void install_fault_reporter() {
  static bool installed = [] {
    struct sigaction sa {};
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO | SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &g_previous[0]);
    sigaction(SIGBUS, &sa, &g_previous[1]);
    return true;
  }();
  (void)installed;
}

bool checks_enabled() {
  const char* e = std::getenv("MULTINORM_EMU_RACECHECK");
  return !(e && std::strcmp(e, "0") == 0);
}

}  // namespace

void begin_launch(const char* kernel, bool journal) {
  g_kernel = kernel;
  {
    std::lock_guard<std::mutex> lock(g_pinned_mutex);
    g_pinned_loads.clear();
  }
  if (!g_device_lo) device::range(&g_device_lo, &g_device_bytes);
  install_fault_reporter();
  const bool checks = checks_enabled();
  g_checks.store(checks, std::memory_order_relaxed);
  g_active.store(checks || journal, std::memory_order_relaxed);
}
void end_launch() {
  g_active.store(false, std::memory_order_relaxed);
  g_checks.store(false, std::memory_order_relaxed);
}
bool instrumented() { return g_instrumented; }

Worker& this_worker() { return t_worker_state; }

Worker& begin_block(uint3 block_idx, dim3 block, void* dynamic_shared, size_t dynamic_bytes) {
  Worker& w = t_worker_state;
  t_worker = &w;
  w.block_idx = block_idx;
  if (!w.static_known) {  // this worker's static __shared__: the kernel module's TLS block
    w.static_known = true;
    if (symbols::tls_block(reinterpret_cast<const void*>(&begin_block), &w.static_lo, &w.static_bytes))
      w.static_cells.resize(w.static_bytes);
  }
  w.serial = g_serial.fetch_add(1, std::memory_order_relaxed) + 1;
  w.gen = 1;
  w.dim = block;
  w.threads = static_cast<int>(block.x * block.y * block.z);
  w.dynamic_lo = static_cast<char*>(dynamic_shared);
  w.dynamic_bytes = dynamic_shared ? dynamic_bytes : 0;
  if (w.dynamic_cells.size() < w.dynamic_bytes) w.dynamic_cells.resize(w.dynamic_bytes);
  reset_clocks(w);
  w.error.clear();
  w.tid = -1;
  return w;
}

// A cp.async's destination: checked as a write now (it must not overwrite bytes others still read),
// then pending until it lands.
void async_copy_issued(const void* p, size_t size) {
  if (!g_checks.load(std::memory_order_relaxed)) return;
  Worker& w = t_worker_state;
  if (w.tid < 0) return;
  check_access(&w, p, size, true, 16);
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const bool is_static = a - reinterpret_cast<uintptr_t>(w.static_lo) < w.static_bytes;
  std::vector<Cell>& cells = is_static ? w.static_cells : w.dynamic_cells;
  const size_t offset = a - reinterpret_cast<uintptr_t>(is_static ? w.static_lo : w.dynamic_lo);
  for (size_t i = 0; i < size && offset + i < cells.size(); ++i) cells[offset + i].pending = true, cells[offset + i].pending_tid = uint16_t(w.tid);
}
// It lands: its bytes are written by the issuing thread now (a __syncthreads must follow before
// other threads read them).
void async_copy_landed(const void* p, size_t size) {
  if (!g_checks.load(std::memory_order_relaxed)) return;
  Worker& w = t_worker_state;
  if (w.tid < 0) return;
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const bool is_static = a - reinterpret_cast<uintptr_t>(w.static_lo) < w.static_bytes;
  std::vector<Cell>& cells = is_static ? w.static_cells : w.dynamic_cells;
  const size_t offset = a - reinterpret_cast<uintptr_t>(is_static ? w.static_lo : w.dynamic_lo);
  for (size_t i = 0; i < size && offset + i < cells.size(); ++i) cells[offset + i].pending = false;
  check_access(&w, p, size, true, 16);
}

void enter_thread(Worker& w, int linear, const ThreadView* view) {
  w.tid = linear;
  w.view = view;
}
void leave_thread(Worker& w) {
  w.tid = -1;
  w.view = nullptr;
}

void barrier_completed() {
  Worker& w = t_worker_state;
  ++w.gen;
  reset_clocks(w);
}

void warp_synced(int warp, unsigned mask) {
  Worker& w = t_worker_state;
  uint32_t join[32] = {};
  const int base = warp * 32;
  for (int l = 0; l < 32; ++l)
    if (mask >> l & 1u)
      for (int k = 0; k < 32; ++k) join[k] = std::max(join[k], w.vc[static_cast<size_t>(base + l) * 32 + k]);
  for (int l = 0; l < 32; ++l)
    if (mask >> l & 1u) {
      uint32_t* row = &w.vc[static_cast<size_t>(base + l) * 32];
      std::memcpy(row, join, sizeof join);
      ++row[l];
    }
}

void mark_instrumented() { g_instrumented = true; }

bool take_error(Worker& w, std::string* what) {
  if (w.error.empty()) return false;
  *what = std::move(w.error);
  w.error.clear();
  return true;
}

}  // namespace cuda_emu::racecheck

namespace cuda_emu {
bool is_shared_address(const void* p, size_t bytes) {
  using namespace racecheck;
  const Worker& w = t_worker_state;
  if (w.tid < 0) return true;  // not inside a block: nothing to tell
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  auto inside = [&](const char* lo, size_t n) { return a - reinterpret_cast<uintptr_t>(lo) < n && a + bytes - reinterpret_cast<uintptr_t>(lo) <= n; };
  // Without the module's TLS block (symbols.h found none) static __shared__ cannot be told apart.
  return inside(w.dynamic_lo, w.dynamic_bytes) || inside(w.static_lo, w.static_bytes) || w.static_bytes == 0;
}
}  // namespace cuda_emu

// ---- the instrumentation's entry points (GCC -fsanitize=thread ABI) --------------------------------
// Hidden: each module that holds instrumented kernels links its own copy of the emulation. Not in the
// sanitizer builds, where the real TSan runtime owns these names (and ASan's kernels carry no hooks).
#if !defined(__SANITIZE_THREAD__) && !defined(__SANITIZE_ADDRESS__)
#define MN_HOOK extern "C" __attribute__((visibility("hidden")))
using cuda_emu::racecheck::on_access;

MN_HOOK void __tsan_init() { cuda_emu::racecheck::mark_instrumented(); }
MN_HOOK void __tsan_func_entry(void*) {}
MN_HOOK void __tsan_func_exit() {}
MN_HOOK void __tsan_vptr_update(void**, void*) {}
MN_HOOK void __tsan_vptr_read(void**) {}
#define MN_SIZED_HOOKS(N)                                                                     \
  MN_HOOK void __tsan_read##N(void* p) { on_access(p, N, false, N); }                       \
  MN_HOOK void __tsan_write##N(void* p) { on_access(p, N, true, N); }                       \
  MN_HOOK void __tsan_unaligned_read##N(void* p) { on_access(p, N, false, 1); }             \
  MN_HOOK void __tsan_unaligned_write##N(void* p) { on_access(p, N, true, 1); }             \
  MN_HOOK void __tsan_volatile_read##N(void* p) { on_access(p, N, false, N); }              \
  MN_HOOK void __tsan_volatile_write##N(void* p) { on_access(p, N, true, N); }              \
  MN_HOOK void __tsan_unaligned_volatile_read##N(void* p) { on_access(p, N, false, 1); }    \
  MN_HOOK void __tsan_unaligned_volatile_write##N(void* p) { on_access(p, N, true, 1); }
MN_SIZED_HOOKS(1)
MN_SIZED_HOOKS(2)
MN_SIZED_HOOKS(4)
MN_SIZED_HOOKS(8)
MN_SIZED_HOOKS(16)
MN_HOOK void __tsan_read_range(void* p, unsigned long size) { on_access(p, size, false, 1); }
MN_HOOK void __tsan_write_range(void* p, unsigned long size) { on_access(p, size, true, 1); }

// Atomics: performed (sequentially consistent whatever order is asked), never shadowed: an atomic
// does not race with an atomic.
#define MN_AW cuda_emu::racecheck::on_atomic(a, sizeof(*a), true)
#define MN_ATOMIC_HOOKS(N, T)                                                                                        \
  MN_HOOK T __tsan_atomic##N##_load(const volatile T* a, int) {                                                      \
    cuda_emu::racecheck::on_atomic(a, sizeof(*a), false);                                                            \
    return __atomic_load_n(a, __ATOMIC_SEQ_CST);                                                                     \
  }                                                                                                                  \
  MN_HOOK void __tsan_atomic##N##_store(volatile T* a, T v, int) { MN_AW; __atomic_store_n(a, v, __ATOMIC_SEQ_CST); } \
  MN_HOOK T __tsan_atomic##N##_exchange(volatile T* a, T v, int) { MN_AW; return __atomic_exchange_n(a, v, __ATOMIC_SEQ_CST); } \
  MN_HOOK T __tsan_atomic##N##_fetch_add(volatile T* a, T v, int) { MN_AW; return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST); } \
  MN_HOOK T __tsan_atomic##N##_fetch_sub(volatile T* a, T v, int) { MN_AW; return __atomic_fetch_sub(a, v, __ATOMIC_SEQ_CST); } \
  MN_HOOK T __tsan_atomic##N##_fetch_and(volatile T* a, T v, int) { MN_AW; return __atomic_fetch_and(a, v, __ATOMIC_SEQ_CST); } \
  MN_HOOK T __tsan_atomic##N##_fetch_or(volatile T* a, T v, int) { MN_AW; return __atomic_fetch_or(a, v, __ATOMIC_SEQ_CST); }   \
  MN_HOOK T __tsan_atomic##N##_fetch_xor(volatile T* a, T v, int) { MN_AW; return __atomic_fetch_xor(a, v, __ATOMIC_SEQ_CST); } \
  MN_HOOK T __tsan_atomic##N##_fetch_nand(volatile T* a, T v, int) { MN_AW; return __atomic_fetch_nand(a, v, __ATOMIC_SEQ_CST); } \
  MN_HOOK int __tsan_atomic##N##_compare_exchange_strong(volatile T* a, T* c, T v, int, int) {                      \
    MN_AW;                                                                                                           \
    return __atomic_compare_exchange_n(a, c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);                          \
  }                                                                                                                  \
  MN_HOOK int __tsan_atomic##N##_compare_exchange_weak(volatile T* a, T* c, T v, int, int) {                        \
    MN_AW;                                                                                                           \
    return __atomic_compare_exchange_n(a, c, v, true, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);                           \
  }                                                                                                                  \
  MN_HOOK T __tsan_atomic##N##_compare_exchange_val(volatile T* a, T c, T v, int, int) {                            \
    MN_AW;                                                                                                           \
    __atomic_compare_exchange_n(a, &c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);                                \
    return c;                                                                                                        \
  }
MN_ATOMIC_HOOKS(8, char)
MN_ATOMIC_HOOKS(16, short)
MN_ATOMIC_HOOKS(32, int)
MN_ATOMIC_HOOKS(64, long)
MN_HOOK void __tsan_atomic_thread_fence(int) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
MN_HOOK void __tsan_atomic_signal_fence(int) { __atomic_signal_fence(__ATOMIC_SEQ_CST); }
#endif  // no sanitizer
