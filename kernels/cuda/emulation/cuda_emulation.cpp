// The emulated CUDA execution model (see cuda_emulation.h): fibers per CUDA thread on Boost.Context's
// fcontext (a few ns per switch), a per-block scheduler that resolves barriers and warp collectives,
// a pool of worker threads for blocks, and sanitizer annotations so ASan and TSan understand the
// stack switches.
#include "cuda_emulation.h"

#include "device_memory.h"
#include "launch_limits.h"
#include "racecheck.h"
#include "symbols.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/context/detail/fcontext.hpp>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define CUDA_EMU_ASAN 1
#endif
#if defined(__SANITIZE_THREAD__)
#define CUDA_EMU_TSAN 1
extern "C" {
void* __tsan_get_current_fiber(void);
void* __tsan_create_fiber(unsigned flags);
void __tsan_destroy_fiber(void* fiber);
void __tsan_switch_to_fiber(void* fiber, unsigned flags);
void __tsan_acquire(void* addr);
void __tsan_release(void* addr);
void __tsan_ignore_thread_begin(void);  // not declared by GCC 12's tsan_interface.h
void __tsan_ignore_thread_end(void);
}
#endif

namespace ctx = boost::context::detail;

namespace cuda_emu {
namespace {

// ---- configuration ------------------------------------------------------------------------------
// The order in which a block's fibers (and a launch's blocks) are run. Interleaved runs lane 0 of
// every warp, then lane 1, ...: a warp's lanes are never consecutive.
enum class Order { Forward, Reverse, Random, Interleaved };
const char* const kOrderNames[] = {"forward", "reverse", "random", "interleaved"};
struct Config {
  int workers = 2;
  std::vector<Order> orders{Order::Forward};  // more than one: each launch runs under each, compared
  uint64_t seed = 1;
  size_t stack_bytes = 256 * 1024;
  // Sampling (large-shape tests only): run just the first and last `edge_blocks` blocks of a launch
  // of the kernels named in edge_kernels (all when empty); the other blocks' outputs are not written.
  uint64_t edge_blocks = 0;
  std::string edge_kernels;
  // A planted bug for the tests of `multinorm doctor`: the named kernel skips its last block.
  std::string plant;
};
Order parse_order(const std::string& s, const char* variable) {
  for (int k = 0; k < 4; ++k)
    if (s == kOrderNames[k]) return static_cast<Order>(k);
  throw std::runtime_error(std::string(variable) + ": '" + s + "' is not forward, reverse, random or interleaved");
}
Config read_config() {
  Config c;
  if (const char* w = std::getenv("MULTINORM_EMU_WORKERS"); w && *w) c.workers = std::max(1, std::atoi(w));
  if (const char* o = std::getenv("MULTINORM_EMU_ORDER"); o && *o) c.orders = {parse_order(o, "MULTINORM_EMU_ORDER")};
  if (const char* o = std::getenv("MULTINORM_EMU_ORDERS"); o && *o) {
    c.orders.clear();
    std::string list(o);
    for (size_t at = 0; at <= list.size();) {
      const size_t comma = std::min(list.find(',', at), list.size());
      c.orders.push_back(parse_order(list.substr(at, comma - at), "MULTINORM_EMU_ORDERS"));
      at = comma + 1;
    }
  }
  if (const char* s = std::getenv("MULTINORM_EMU_SEED"); s && *s) c.seed = std::strtoull(s, nullptr, 10);
  if (const char* k = std::getenv("MULTINORM_EMU_STACK_KB"); k && *k) c.stack_bytes = std::max(16L, std::atol(k)) * 1024;
  if (const char* e = std::getenv("MULTINORM_EMU_EDGE_BLOCKS"); e && *e) c.edge_blocks = std::strtoull(e, nullptr, 10);
  if (const char* e = std::getenv("MULTINORM_EMU_EDGE_KERNELS"); e && *e) c.edge_kernels = std::string(",") + e + ",";
  if (const char* p = std::getenv("MULTINORM_EMU_PLANT"); p && *p) c.plant = p;
  return c;
}

// ---- one CUDA thread ----------------------------------------------------------------------------
enum class State : uint8_t { Ready, AtBarrier, AtWarp, Done };

struct Stack {
  void* base = nullptr;  // lowest address (guard page first)
  size_t bytes = 0;      // including the guard page
};

// A cp.async in flight: its 16 bytes read at issue, written to `dst` when it lands.
struct AsyncCopy {
  void* dst = nullptr;
  unsigned char data[16] = {};
};

struct Block;

struct Fiber {
  uint3 idx{};
  int linear = 0, lane = 0, warp = 0;
  Block* block = nullptr;
  State state = State::Ready;
  racecheck::ThreadView view;  // its stack, and whether it runs the kernel's code yet (racecheck's reach)
  // warp collective mailbox
  WarpOp op = WarpOp::Sync;
  unsigned mask = 0;
  uint64_t value = 0, result = 0;
  int arg = 0, width = 32;
  // context switching
  ctx::fcontext_t fc = nullptr;   // where to resume this fiber
  ctx::fcontext_t ret = nullptr;  // where to return to the scheduler
  Stack stack;
  const std::function<void()>* body = nullptr;
  std::string error;  // an exception thrown by the body
  // cp.async: the copies since the last commit, and the committed groups, oldest first (a vector, not
  // a deque: a block resets each of its fibers to Fiber{}, and a default std::deque allocates)
  std::vector<AsyncCopy> async_open;
  std::vector<std::vector<AsyncCopy>> async_groups;
#if CUDA_EMU_ASAN
  void* fake_stack = nullptr;
  const void* sched_bottom = nullptr;
  size_t sched_size = 0;
#endif
#if CUDA_EMU_TSAN
  void* tsan_fiber = nullptr;
#endif
};

struct Block {
  uint3 idx{};
  dim3 dim, grid;
  unsigned char* shared = nullptr;
  int barrier_generation = 0;
  std::vector<unsigned> warp_generation;  // per warp: collectives completed (TSan anchors alternate)
  int at_warp = 0;                        // threads waiting at a warp collective (none: nothing to resolve)
  // per warp: the lanes' contributions to the last warp_exchange (lane k's bytes at k * bytes); read
  // by every lane before any of them can complete the warp's next collective
  std::vector<std::vector<unsigned char>> exchange;
#if CUDA_EMU_TSAN
  // TSan sync anchors of this block: [barrier gen even, odd, then per warp: even, odd]. Heap memory,
  // freed with the block, so TSan forgets them: no happens-before edge leaks from one block to the
  // next one run by the same worker (whose static __shared__ it sees).
  std::unique_ptr<char[]> anchors{new char[2 + 2 * 32]};
  uint64_t worker_seq = 0;  // this block's position among the blocks its worker has run
#endif
};

thread_local Fiber* t_fiber = nullptr;
thread_local Block* t_block = nullptr;

[[noreturn]] void fail(const std::string& what) { throw std::runtime_error(what); }

// Per-worker resources, reused across blocks and launches: fiber stacks, fibers, shared memory.
struct WorkerResources {
  // A block that failed leaves its fibers' frames on their stacks; under ASan their red zones stay
  // poisoned and must be cleared before the stacks are reused.
  bool stacks_dirty = false;
  std::vector<Stack> stacks;
  std::vector<Fiber> fibers;
  std::vector<unsigned char> shared;
  ~WorkerResources() {
    for (Stack& s : stacks) ::munmap(s.base, s.bytes);
  }
};
thread_local WorkerResources t_resources;

Stack make_stack(size_t bytes) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t total = (bytes + page - 1) / page * page + page;
  void* p = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) fail("emulated CUDA: cannot map a " + std::to_string(total) + "-byte fiber stack");
  ::mprotect(p, page, PROT_NONE);  // guard page: a stack overflow faults instead of corrupting memory
  return {p, total};
}

// TSan sync anchors of a launch's start and end (a block's barrier and warp anchors live in the
// Block; two per barrier/warp, alternating by generation, so a thread that runs ahead into the next
// generation cannot lend its writes to a thread still acquiring the previous one).
#if CUDA_EMU_TSAN
char g_launch_anchor, g_launch_end_anchor;
// Orders a worker's blocks: the k-th block's threads acquire anchor k % 2, which the (k-1)-th block's
// threads released into; they release into the other one, which no thread of their own block
// acquires (a thread that finished must not appear ordered before its block-mates).
thread_local char t_worker_anchor[2];
thread_local uint64_t t_blocks_run = 0;
thread_local void* t_scheduler_tsan_fiber = nullptr;
// The emulation's own bookkeeping (fiber states, mailboxes, contexts) is not the kernel's memory:
// TSan ignores it, and sees only the kernel's accesses and the happens-before edges of launches,
// barriers and warp collectives.
#define EMU_BOOKKEEPING_BEGIN() __tsan_ignore_thread_begin()
#define EMU_BOOKKEEPING_END() __tsan_ignore_thread_end()
#else
#define EMU_BOOKKEEPING_BEGIN() ((void)0)
#define EMU_BOOKKEEPING_END() ((void)0)
#endif

// ---- switching ------------------------------------------------------------------------------------
void fiber_entry(ctx::transfer_t t);

// (t_fiber keeps pointing at the last fiber run until the block ends: the scheduler never reads it.)
void switch_to_fiber(Fiber& f, racecheck::Worker& checks) {
  t_fiber = &f;
  racecheck::enter_thread(checks, f.linear, &f.view);
#if CUDA_EMU_ASAN
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(&fake, f.stack.base, f.stack.bytes);
#endif
#if CUDA_EMU_TSAN
  __tsan_switch_to_fiber(f.tsan_fiber, 1 /* no sync: barriers and collectives synchronise explicitly */);
#endif
  const ctx::transfer_t r = ctx::jump_fcontext(f.fc, &f);
#if CUDA_EMU_ASAN
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
  f.fc = r.fctx;
  racecheck::leave_thread(checks);
}

// Back to the scheduler; returns when the scheduler resumes this fiber.
void yield_to_scheduler(Fiber& f, bool finished) {
#if CUDA_EMU_TSAN
  // Everything this thread did so far happens before the host returns from the launch, even when
  // the launch fails and this fiber is abandoned here.
  __tsan_release(&g_launch_end_anchor);
#endif
  if (!finished) EMU_BOOKKEEPING_BEGIN();  // a finished fiber is destroyed with its ignores balanced
#if CUDA_EMU_ASAN
  __sanitizer_start_switch_fiber(finished ? nullptr : &f.fake_stack, f.sched_bottom, f.sched_size);
#else
  (void)finished;
#endif
#if CUDA_EMU_TSAN
  __tsan_switch_to_fiber(t_scheduler_tsan_fiber, 1);
#endif
  const ctx::transfer_t r = ctx::jump_fcontext(f.ret, nullptr);
  f.ret = r.fctx;
#if CUDA_EMU_ASAN
  __sanitizer_finish_switch_fiber(f.fake_stack, &f.sched_bottom, &f.sched_size);
#endif
  EMU_BOOKKEEPING_END();
}

// The fiber's oldest committed cp.async groups land, until `pending` groups are left in flight.
void land_async_groups(Fiber& f, int pending) {
  auto& groups = f.async_groups;
  size_t landed = 0;
  for (; static_cast<int>(groups.size() - landed) > pending; ++landed)
    for (const AsyncCopy& c : groups[landed]) racecheck::async_copy_landed(c.dst, 16), std::memcpy(c.dst, c.data, 16);
  groups.erase(groups.begin(), groups.begin() + static_cast<std::ptrdiff_t>(landed));
}

void fiber_entry(ctx::transfer_t t) {
  Fiber& f = *static_cast<Fiber*>(t.data);
  EMU_BOOKKEEPING_BEGIN();
  f.ret = t.fctx;
#if CUDA_EMU_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &f.sched_bottom, &f.sched_size);
#endif
  const std::function<void()>& body = *f.body;
#if CUDA_EMU_TSAN
  const uint64_t seq = t_block->worker_seq;
#endif
  EMU_BOOKKEEPING_END();
#if CUDA_EMU_TSAN
  __tsan_acquire(&g_launch_anchor);
  __tsan_acquire(&t_worker_anchor[seq & 1]);
#endif
  std::string error;
  try {
    body();
  } catch (const std::exception& e) {
    error = e.what();
  } catch (...) {
    error = "unknown exception";
  }
#if CUDA_EMU_TSAN
  __tsan_release(&g_launch_end_anchor);
  __tsan_release(&t_worker_anchor[(seq + 1) & 1]);
#endif
  EMU_BOOKKEEPING_BEGIN();
  // A thread that ends with copies in flight: they land (a GPU completes them; no thread of its
  // block can wait for them any more).
  if (!f.async_open.empty()) f.async_groups.push_back(std::move(f.async_open)), f.async_open.clear();
  land_async_groups(f, 0);
  f.error = std::move(error);
  f.state = State::Done;
  EMU_BOOKKEEPING_END();
  yield_to_scheduler(f, true);
  std::abort();  // a finished fiber is never resumed
}

std::string lane_list(unsigned bits) {
  std::string s;
  for (int l = 0; l < 32; ++l)
    if (bits >> l & 1u) s += (s.empty() ? "" : ",") + std::to_string(l);
  return s;
}

std::string where(const Block& b, const Fiber* f = nullptr) {
  std::string s = "block (" + std::to_string(b.idx.x) + "," + std::to_string(b.idx.y) + "," + std::to_string(b.idx.z) + ")";
  if (f) s += " thread (" + std::to_string(f->idx.x) + "," + std::to_string(f->idx.y) + "," + std::to_string(f->idx.z) + ")";
  return s;
}

char hex(unsigned v) { return "0123456789abcdef"[v & 15]; }
std::string mask_hex(unsigned m) {
  std::string s = "0x";
  for (int i = 7; i >= 0; --i) s += hex(m >> (4 * i));
  return s;
}

// Resolves every warp collective whose participants have all arrived. Returns true on progress.
bool resolve_warps(Block& b, std::vector<Fiber>& fibers, int n) {
  if (b.at_warp == 0) return false;
  bool progress = false;
  for (int w0 = 0; w0 < n; w0 += 32) {
    const int lanes = std::min(32, n - w0);
    const unsigned existing = lanes == 32 ? 0xffffffffu : ((1u << lanes) - 1u);
    unsigned handled = 0;
    for (int l = 0; l < lanes; ++l) {
      Fiber& f = fibers[w0 + l];
      if (f.state != State::AtWarp || (handled >> l & 1u)) continue;
      const unsigned m = f.mask;
      if (!(m >> l & 1u)) fail(where(b, &f) + ": warp collective with mask " + mask_hex(m) + " that excludes the calling lane " + std::to_string(l));
      if (m & ~existing) fail(where(b, &f) + ": warp mask " + mask_hex(m) + " names lanes " + lane_list(m & ~existing) + " that do not exist in this block");
      bool all_here = true;
      for (int k = 0; k < lanes; ++k) {
        if (!(m >> k & 1u)) continue;
        const Fiber& o = fibers[w0 + k];
        if (o.state == State::Done)
          fail(where(b, &f) + ": warp collective with mask " + mask_hex(m) + " waits for lane " + std::to_string(k) + ", which has exited (a GPU would hang)");
        if (o.state != State::AtWarp) {
          all_here = false;
          continue;
        }
        if (o.mask != m)
          fail(where(b, &f) + ": lanes disagree on the warp mask: lane " + std::to_string(l) + " passes " + mask_hex(m) + ", lane " + std::to_string(k) + " passes " + mask_hex(o.mask));
        if (o.op != f.op) fail(where(b, &f) + ": lanes " + std::to_string(l) + " and " + std::to_string(k) + " of a warp reached different warp collectives");
        if (f.op == WarpOp::Exchange && o.arg != f.arg)
          fail(where(b, &f) + ": lanes " + std::to_string(l) + " and " + std::to_string(k) + " of a warp exchange pass " + std::to_string(f.arg) + " and " +
               std::to_string(o.arg) + " bytes (different warp-matrix instructions)");
      }
      if (!all_here) continue;
      handled |= m;
      // Everyone is here: compute each participant's result.
      if (f.op == WarpOp::Exchange) {
        std::vector<unsigned char>& x = b.exchange[w0 / 32];
        x.assign(static_cast<size_t>(32) * f.arg, 0);
        for (int k = 0; k < lanes; ++k)
          if (m >> k & 1u) std::memcpy(x.data() + static_cast<size_t>(k) * f.arg, reinterpret_cast<const void*>(fibers[w0 + k].value), f.arg);
      }
      uint64_t ballot = 0, sum = 0, mn = ~0ull, mx = 0;
      for (int k = 0; k < lanes; ++k)
        if (m >> k & 1u) {
          const uint64_t v = fibers[w0 + k].value;
          if (v) ballot |= 1ull << k;
          sum += v, mn = std::min(mn, v), mx = std::max(mx, v);
        }
      for (int k = 0; k < lanes; ++k) {
        if (!(m >> k & 1u)) continue;
        Fiber& o = fibers[w0 + k];
        const int width = o.width;
        if (width < 1 || width > 32 || (width & (width - 1)))
          fail(where(b, &o) + ": shuffle width " + std::to_string(width) + " is not a power of two in 1..32");
        const int seg = k & ~(width - 1);
        int src = k;
        switch (o.op) {
          case WarpOp::Sync: break;
          case WarpOp::ShflIdx: src = seg + (o.arg & (width - 1)); break;
          case WarpOp::ShflUp: src = k - o.arg < seg ? k : k - o.arg; break;
          case WarpOp::ShflDown: src = k + o.arg >= seg + width ? k : k + o.arg; break;
          case WarpOp::ShflXor: src = (k ^ o.arg) >= seg + width ? k : (k ^ o.arg); break;
          default: break;
        }
        switch (o.op) {
          case WarpOp::ShflIdx:
          case WarpOp::ShflUp:
          case WarpOp::ShflDown:
          case WarpOp::ShflXor:
            if (src < 0 || src >= 32 || !(m >> src & 1u))
              fail(where(b, &o) + ": shuffle reads lane " + std::to_string(src) + ", which is not in the mask " + mask_hex(m) + " (undefined on a GPU)");
            o.result = fibers[w0 + src].value;
            break;
          case WarpOp::Ballot: o.result = ballot; break;
          case WarpOp::Any: o.result = ballot != 0; break;
          case WarpOp::All: o.result = ballot == (m & 0xffffffffull); break;
          case WarpOp::ReduceAdd: o.result = sum & 0xffffffffull; break;
          case WarpOp::ReduceMin: o.result = mn; break;
          case WarpOp::ReduceMax: o.result = mx; break;
          case WarpOp::Exchange:
            o.result = reinterpret_cast<uintptr_t>(b.exchange[w0 / 32].data());
            o.view.state_lo[2] = reinterpret_cast<const char*>(b.exchange[w0 / 32].data()), o.view.state_bytes[2] = b.exchange[w0 / 32].size();
            break;
          case WarpOp::Sync: break;
        }
      }
      for (int k = 0; k < lanes; ++k)
        if (m >> k & 1u) fibers[w0 + k].state = State::Ready, --b.at_warp;
      // Only __syncwarp orders memory between lanes (the programming guide); shuffles and votes do not.
      if (f.op == WarpOp::Sync) racecheck::warp_synced(w0 / 32, m);
      ++b.warp_generation[w0 / 32];
      progress = true;
    }
  }
  return progress;
}

void run_block(Block& b, const std::function<void()>& body, size_t shared_bytes, const Config& cfg, Order order_kind, uint64_t block_linear) {
  WorkerResources& res = t_resources;
  const int n = static_cast<int>(b.dim.x * b.dim.y * b.dim.z);
  if (res.shared.size() < shared_bytes) res.shared.resize(shared_bytes);
  if (shared_bytes > 0) std::memset(res.shared.data(), 0xff, shared_bytes);  // NaN in every float/bf16: uninitialised reads show
  b.shared = shared_bytes > 0 ? res.shared.data() : nullptr;
  if (!res.stacks.empty() && res.stacks[0].bytes < cfg.stack_bytes) {  // stack size raised: remap all
    for (Stack& s : res.stacks) ::munmap(s.base, s.bytes);
    res.stacks.clear();
  }
  while (static_cast<int>(res.stacks.size()) < n) res.stacks.push_back(make_stack(cfg.stack_bytes));
#if CUDA_EMU_ASAN
  if (res.stacks_dirty) {
    const size_t guard = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    for (Stack& st : res.stacks) __asan_unpoison_memory_region(static_cast<char*>(st.base) + guard, st.bytes - guard);
    res.stacks_dirty = false;
  }
#endif
  if (static_cast<int>(res.fibers.size()) < n) res.fibers.resize(n);
  std::vector<Fiber>& fibers = res.fibers;  // the first n belong to this block
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  int i = 0;
  for (unsigned z = 0; z < b.dim.z; ++z)
    for (unsigned y = 0; y < b.dim.y; ++y)
      for (unsigned x = 0; x < b.dim.x; ++x, ++i) {
        Fiber& f = fibers[i];
        f = Fiber{};
#if CUDA_EMU_TSAN
        // A fresh TSan fiber per CUDA thread per block: a reused one would order this block's thread
        // after the previous block's thread of the same slot and hide races through static shared
        // memory, which keeps the previous block's contents.
        f.tsan_fiber = __tsan_create_fiber(0);
#endif
        f.idx = make_uint3(x, y, z);
        f.linear = i, f.lane = i % 32, f.warp = i / 32;
        f.block = &b;
        f.stack = res.stacks[i];
        f.view.stack_lo = static_cast<const char*>(f.stack.base);
        f.view.stack_bytes = f.stack.bytes;
        f.view.state_lo[0] = reinterpret_cast<const char*>(&f), f.view.state_bytes[0] = sizeof(Fiber);
        f.view.state_lo[1] = reinterpret_cast<const char*>(&b), f.view.state_bytes[1] = sizeof(Block);
        f.body = &body;
        char* top = static_cast<char*>(f.stack.base) + f.stack.bytes;
        f.fc = ctx::make_fcontext(top, f.stack.bytes - page, fiber_entry);
      }
  b.warp_generation.assign((n + 31) / 32, 0);
  b.exchange.resize((n + 31) / 32);
#if CUDA_EMU_TSAN
  b.worker_seq = t_blocks_run++;
#endif
  std::vector<int> order;
  order.reserve(n);
  if (order_kind == Order::Interleaved) {
    for (int lane = 0; lane < 32; ++lane)
      for (int w = lane; w < n; w += 32) order.push_back(w);
  } else {
    for (int k = 0; k < n; ++k) order.push_back(order_kind == Order::Reverse ? n - 1 - k : k);
  }
  std::mt19937_64 rng(cfg.seed * 0x9e3779b97f4a7c15ULL + block_linear);
  racecheck::Worker& checks = racecheck::begin_block(b.idx, b.dim, b.shared, shared_bytes);
  t_block = &b;
#if CUDA_EMU_TSAN
  t_scheduler_tsan_fiber = __tsan_get_current_fiber();
#endif
  for (;;) {
    // Run every ready thread until it reaches a barrier, a warp collective or its end.
    if (order_kind == Order::Random) std::shuffle(order.begin(), order.end(), rng);
    bool ran = false;
    for (int k : order) {
      Fiber& f = fibers[k];
      if (f.state != State::Ready) continue;
      switch_to_fiber(f, checks);
      ran = true;
      if (!f.error.empty()) fail(where(b, &f) + ": " + f.error);
      if (std::string e; racecheck::take_error(checks, &e)) fail(where(b, &f) + ": " + e);
    }
    if (resolve_warps(b, fibers, n) || ran) continue;
    int done = 0, at_barrier = 0;
    for (int k = 0; k < n; ++k) {
      done += fibers[k].state == State::Done;
      at_barrier += fibers[k].state == State::AtBarrier;
    }
    if (done == n) break;
    if (at_barrier == n - done) {
      if (done > 0) {
        int d = 0;
        while (fibers[d].state != State::Done) ++d;
        fail(where(b, &fibers[d]) + " exited without reaching a __syncthreads that " + std::to_string(at_barrier) + " of " +
             std::to_string(n) + " threads wait at (barrier divergence: a GPU hangs or misbehaves)");
      }
      for (int k = 0; k < n; ++k) fibers[k].state = State::Ready;
      ++b.barrier_generation;
      racecheck::barrier_completed();
      continue;
    }
    // Some threads wait at a barrier, others at a warp collective that cannot complete.
    for (int k = 0; k < n; ++k)
      if (fibers[k].state == State::AtWarp)
        fail(where(b, &fibers[k]) + ": deadlock: a warp collective with mask " + mask_hex(fibers[k].mask) +
             " waits for lanes that are at __syncthreads or in a different collective");
    fail(where(b) + ": deadlock in the emulated block");
  }
#if CUDA_EMU_TSAN
  for (int k = 0; k < n; ++k) __tsan_destroy_fiber(fibers[k].tsan_fiber), fibers[k].tsan_fiber = nullptr;
#endif
  t_block = nullptr;
  t_fiber = nullptr;
}

// ---- worker pool ----------------------------------------------------------------------------------
class Pool {
 public:
  // Runs job(worker) on `workers` threads of the pool and waits for all of them.
  void run(int workers, const std::function<void(int)>& job) {
    std::unique_lock<std::mutex> lock(mu_);
    while (static_cast<int>(threads_.size()) < workers) {
      const int id = static_cast<int>(threads_.size());
      threads_.emplace_back([this, id] { loop(id); });
    }
    job_ = &job;
    active_ = workers;
    pending_ = workers;
    ++generation_;
    cv_.notify_all();
    done_cv_.wait(lock, [this] { return pending_ == 0; });
    job_ = nullptr;
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }

 private:
  void loop(int id) {
    uint64_t seen = 0;
    for (;;) {
      const std::function<void(int)>* job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        if (id >= active_) continue;
        job = job_;
      }
      (*job)(id);
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) done_cv_.notify_all();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::vector<std::thread> threads_;
  const std::function<void(int)>* job_ = nullptr;
  int active_ = 0, pending_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

Pool& pool() {
  static Pool p;
  return p;
}
std::mutex g_launch_mutex;  // one emulated launch at a time (a single in-order stream)

}  // namespace

// ---- what kernels call ------------------------------------------------------------------------------
const uint3& thread_idx() { return t_fiber->idx; }

void check_pointer_argument(int index, const char* type_name, const void* p) {
  if (is_kernel_reachable(p)) return;
  char buf[40];
  std::snprintf(buf, sizeof buf, "%p", p);
  fail("argument " + std::to_string(index) + " (" + symbols::demangle(type_name) + ") is " + buf + ", " + device::describe(p) +
       ": a kernel reaches only device allocations and pinned host memory (on a GPU it faults with cudaErrorIllegalAddress where "
       "it dereferences this pointer)");
}

void kernel_entry(const void*) {
  if (t_fiber) t_fiber->view.in_kernel = true;
}
void kernel_exit() {
  if (t_fiber) t_fiber->view.in_kernel = false;
}


void async_copy(void* shared_dst, const void* global_src, int src_bytes) {
  if (!t_fiber) throw std::runtime_error("cp.async outside a kernel");
  if (src_bytes > 0 && !device::contains(global_src, static_cast<size_t>(src_bytes)) &&
      !device::is_pinned(global_src, static_cast<size_t>(src_bytes))) {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%p", global_src);
    throw std::runtime_error(std::string("cp.async: the source ") + buf + " is " + device::describe(global_src) +
                             ", not global memory holding all " + std::to_string(src_bytes) + " bytes (a GPU faults: cudaErrorIllegalAddress)");
  }
  if (reinterpret_cast<uintptr_t>(shared_dst) % 16 || reinterpret_cast<uintptr_t>(global_src) % 16)
    throw std::runtime_error("cp.async: a 16-byte copy at an address not 16-byte aligned (a GPU stops the kernel)");
  if (!is_shared_address(shared_dst, 16)) throw std::runtime_error("cp.async: the destination is not shared memory (a GPU stops the kernel)");
  if (src_bytes < 0 || src_bytes > 16) throw std::runtime_error("cp.async: src-size " + std::to_string(src_bytes) + " outside 0..16");
  AsyncCopy c;
  c.dst = shared_dst;
  if (src_bytes > 0) std::memcpy(c.data, global_src, static_cast<size_t>(src_bytes));  // the rest zero-filled
  racecheck::async_copy_issued(shared_dst, 16);
  t_fiber->async_open.push_back(c);
}
void async_commit() {
  if (!t_fiber) throw std::runtime_error("cp.async.commit_group outside a kernel");
  t_fiber->async_groups.push_back(std::move(t_fiber->async_open));
  t_fiber->async_open.clear();
}
void async_wait(int pending) {
  if (!t_fiber) throw std::runtime_error("cp.async.wait_group outside a kernel");
  land_async_groups(*t_fiber, pending);
}

const uint3& block_idx() { return t_block->idx; }
const dim3& block_dim() { return t_block->dim; }
const dim3& grid_dim() { return t_block->grid; }
void* dynamic_shared() { return t_block->shared; }

namespace {
// Suspends the calling fiber at a barrier or warp collective. Under TSan its accesses so far are
// released to the sync point's anchor, and on resuming it acquires what every participant released.
void wait_at_sync_point(Fiber& f, char* anchor) {
#if CUDA_EMU_TSAN
  __tsan_release(anchor);
#endif
  yield_to_scheduler(f, false);
#if CUDA_EMU_TSAN
  __tsan_acquire(anchor);
#else
  (void)anchor;
#endif
}
}  // namespace

void syncthreads() {
  EMU_BOOKKEEPING_BEGIN();
  Fiber& f = *t_fiber;
  f.state = State::AtBarrier;
  char* anchor = nullptr;
#if CUDA_EMU_TSAN
  anchor = &t_block->anchors[t_block->barrier_generation & 1];
#endif
  EMU_BOOKKEEPING_END();
  wait_at_sync_point(f, anchor);
}

uint64_t warp_collective(WarpOp op, unsigned mask, uint64_t value, int arg, int width) {
  EMU_BOOKKEEPING_BEGIN();
  Fiber& f = *t_fiber;
  f.op = op, f.mask = mask, f.value = value, f.arg = arg, f.width = width;
  f.state = State::AtWarp;
  ++f.block->at_warp;
  char* anchor = nullptr;
#if CUDA_EMU_TSAN
  anchor = &t_block->anchors[2 + 2 * (f.warp % 32) + (t_block->warp_generation[f.warp] & 1)];
#endif
  EMU_BOOKKEEPING_END();
  wait_at_sync_point(f, anchor);
  EMU_BOOKKEEPING_BEGIN();
  const uint64_t result = f.result;
  EMU_BOOKKEEPING_END();
  return result;
}

const void* warp_exchange(unsigned mask, const void* mine, int bytes) {
  return reinterpret_cast<const void*>(static_cast<uintptr_t>(warp_collective(WarpOp::Exchange, mask, reinterpret_cast<uintptr_t>(mine), bytes, 32)));
}

namespace {
// Block `id` of a launch's issue order (forward, reversed, or a pseudo-random permutation), so that
// blocks meet each other's memory in different orders too.
uint64_t block_of(uint64_t id, uint64_t blocks, Order order, uint64_t seed) {
  if (order == Order::Reverse) return blocks - 1 - id;
  if (order != Order::Random || blocks < 2) return id;
  uint64_t a = (seed * 0x9e3779b97f4a7c15ULL) % blocks | 1;  // an odd multiplier coprime to blocks
  auto gcd = [](uint64_t x, uint64_t y) { while (y) x %= y, std::swap(x, y); return x; };
  while (gcd(a, blocks) != 1) a += 2;
  return static_cast<uint64_t>((static_cast<unsigned __int128>(a) * id + seed) % blocks);
}

// Runs every block of the launch under `order` (or only its edge blocks: Config); returns the first
// error ("" if none).
std::string run_grid(const char* name, dim3 grid, dim3 block, size_t shared_bytes, const std::function<void()>& body, const Config& cfg,
                     Order order) {
  const uint64_t all_blocks = static_cast<uint64_t>(grid.x) * grid.y * grid.z;
  const bool sampled = cfg.edge_blocks > 0 && 2 * cfg.edge_blocks < all_blocks &&
                       (cfg.edge_kernels.empty() || cfg.edge_kernels.find(std::string(",") + name + ",") != std::string::npos);
  uint64_t blocks = sampled ? 2 * cfg.edge_blocks : all_blocks;
  if (!cfg.plant.empty() && cfg.plant == name && blocks > 1) --blocks;  // the planted bug: the last block never runs
  std::atomic<uint64_t> next{0};
  std::mutex err_mu;
  std::string first_error;
#if CUDA_EMU_TSAN
  __tsan_release(&g_launch_anchor);
#endif
  const int workers = static_cast<int>(std::min<uint64_t>(cfg.workers, blocks));
  pool().run(workers, [&](int) {
#if CUDA_EMU_TSAN
    __tsan_ignore_thread_begin();
#endif
    for (;;) {
      const uint64_t issued = next.fetch_add(1);
      if (issued >= blocks) break;
      {
        std::lock_guard<std::mutex> l(err_mu);
        if (!first_error.empty()) break;
      }
      uint64_t id = block_of(issued, blocks, order, cfg.seed);
      if (sampled && id >= cfg.edge_blocks) id += all_blocks - blocks;  // the last edge_blocks
      Block b;
      b.idx = make_uint3(static_cast<unsigned>(id % grid.x), static_cast<unsigned>(id / grid.x % grid.y),
                         static_cast<unsigned>(id / (static_cast<uint64_t>(grid.x) * grid.y)));
      b.dim = block, b.grid = grid;
      try {
        run_block(b, body, shared_bytes, cfg, order, id);
      } catch (const std::exception& e) {
        // The block's fibers are abandoned mid-flight; their stacks are reused by the next launch.
        t_resources.stacks_dirty = true;
        t_block = nullptr;
        t_fiber = nullptr;
        racecheck::leave_thread(racecheck::this_worker());
        std::lock_guard<std::mutex> l(err_mu);
        if (first_error.empty()) first_error = e.what();
      }
    }
#if CUDA_EMU_TSAN
    __tsan_ignore_thread_end();
#endif
  });
#if CUDA_EMU_TSAN
  __tsan_acquire(&g_launch_end_anchor);
#endif
  return first_error;
}

struct RacecheckLaunch {
  RacecheckLaunch(const char* name, bool journal) { racecheck::begin_launch(name, journal); }
  ~RacecheckLaunch() { racecheck::end_launch(); }
};

// "" when the pages a run wrote hold what the first run left in them; `first` maps each page the first
// run wrote to its result, `run` is this run's journal (pages it wrote, with their contents before).
std::string compare_pages(const std::map<char*, std::vector<char>>& first, const device::Journal& run) {
  auto differs = [](const char* page, const std::vector<char>& expected) -> std::string {
    if (std::memcmp(page, expected.data(), expected.size()) == 0) return "";
    size_t i = 0;
    while (page[i] == expected[i]) ++i;
    char buf[160];
    std::snprintf(buf, sizeof buf, "device memory at %p: 0x%02x, then 0x%02x", static_cast<const void*>(page + i),
                  static_cast<unsigned char>(expected[i]), static_cast<unsigned char>(page[i]));
    return buf;
  };
  for (const auto& [page, result] : first)
    if (std::string d = differs(page, result); !d.empty()) return d;
  for (const auto& [page, before] : run.pages)  // written by this run only: must hold what the first run left (untouched)
    if (!first.count(page))
      if (std::string d = differs(page, before); !d.empty()) return d;
  return "";
}
// MULTINORM_EMU_LAUNCH_LOG=file: each kernel name this process launches, once, appended to the file
// (which kernels a workload reaches: tests/gpu_check.sh checks the sanitizer's targets reach all).
void log_launch(const char* name) {
  static std::mutex mu;
  static std::set<std::string> logged;
  const char* path = std::getenv("MULTINORM_EMU_LAUNCH_LOG");
  if (!path || !*path) return;
  std::lock_guard<std::mutex> lock(mu);
  if (!logged.insert(name).second) return;
  if (FILE* f = std::fopen(path, "a")) {
    std::fprintf(f, "%s\n", name);
    std::fclose(f);
  }
}
void restore_pages(const device::Journal& j) {
  for (const auto& [page, before] : j.pages) std::memcpy(page, before.data(), before.size());
}
}  // namespace

void launch(const char* name, const void* fn, dim3 grid, dim3 block, size_t shared_bytes, const std::function<void()>& body) {
  auto bad = [&](const std::string& why) {
    fail(std::string("emulated launch of ") + name + " (grid " + std::to_string(grid.x) + "x" + std::to_string(grid.y) + "x" +
         std::to_string(grid.z) + ", block " + std::to_string(block.x) + "x" + std::to_string(block.y) + "x" + std::to_string(block.z) +
         ", " + std::to_string(shared_bytes) + " B dynamic shared): " + why);
  };
  if (std::string why = limits::check_launch(fn, grid, block, shared_bytes); !why.empty()) bad(why);
  log_launch(name);

  const Config cfg = read_config();
  std::lock_guard<std::mutex> lock(g_launch_mutex);
  const bool several = cfg.orders.size() > 1, journal = several && racecheck::instrumented();
  RacecheckLaunch checks(name, journal);
  if (!several) {
    if (std::string e = run_grid(name, grid, block, shared_bytes, body, cfg, cfg.orders[0]); !e.empty()) bad(e);
    return;
  }
  auto order_error = [&](size_t k, const std::string& d) {
    bad(std::string("the result depends on the execution order: the ") + kOrderNames[static_cast<int>(cfg.orders[0])] + " and " +
        kOrderNames[static_cast<int>(cfg.orders[k])] + " orders leave different bytes in " + d +
        " (a race through global memory, or blocks that depend on each other)");
  };
  if (journal) {
    // Each run starts from the same device memory and must leave the same bytes; the instrumented
    // kernels' stores save each page before its first write, so a run is undone page by page.
    device::journal_begin();
    std::string e = run_grid(name, grid, block, shared_bytes, body, cfg, cfg.orders[0]);
    const device::Journal first_run = device::journal_end();
    if (!e.empty()) bad(e);
    std::map<char*, std::vector<char>> first;  // page -> the first run's result
    for (const auto& [page, before] : first_run.pages) first.emplace(page, std::vector<char>(page, page + before.size()));
    restore_pages(first_run);
    for (size_t k = 1; k < cfg.orders.size(); ++k) {
      device::journal_begin();
      e = run_grid(name, grid, block, shared_bytes, body, cfg, cfg.orders[k]);
      const device::Journal run = device::journal_end();
      if (!e.empty()) bad(e);
      const std::string d = compare_pages(first, run);
      restore_pages(run);
      if (!d.empty()) order_error(k, d);
    }
    for (const auto& [page, result] : first) std::memcpy(page, result.data(), result.size());
    return;
  }
  // Without instrumentation (the sanitizer builds): whole-memory images.
  const DeviceImage before = save_device_memory();
  if (std::string e = run_grid(name, grid, block, shared_bytes, body, cfg, cfg.orders[0]); !e.empty()) bad(e);
  const DeviceImage after = save_device_memory();
  for (size_t k = 1; k < cfg.orders.size(); ++k) {
    restore_device_memory(before);
    if (std::string e = run_grid(name, grid, block, shared_bytes, body, cfg, cfg.orders[k]); !e.empty()) bad(e);
    if (std::string d = compare_device_memory(after); !d.empty()) order_error(k, d);
  }
}

}  // namespace cuda_emu
