// The emulated CUDA build: what kernel sources see when g++ (not nvcc) compiles them. Every CUDA
// thread of a block runs as a cooperative fiber on one worker OS thread; blocks are spread over N
// workers. Barriers, warp collectives and atomics have CUDA's semantics, and misuse that a GPU would
// hang on or silently get wrong is an error here (a barrier not reached by every thread, a mask
// naming an exited or missing lane, lanes disagreeing on a mask, a launch past sm_80's limits:
// launch_limits.h), as are shared-memory races, reads of shared memory nothing wrote and misaligned
// accesses (racecheck.h).
//
// This is a test instrument (the same .cu sources, executed on the CPU in CI), never a backend.
// Kernel files never include this header directly: they include kernels/cuda/cuda_compat.h, which
// picks the real CUDA headers under nvcc and this one under g++. See docs/cuda.md for the rules.
//
// Environment (read at every launch, so a test can change it between launches):
//   MULTINORM_EMU_WORKERS  worker threads running blocks (default 2)
//   MULTINORM_EMU_ORDER    fiber and block order: forward | reverse | random | interleaved (lane 0 of
//                          every warp, then lane 1, ...) (default forward)
//   MULTINORM_EMU_ORDERS   a comma-separated list of orders: every launch runs once under each, from
//                          the same device memory, and must leave the same bytes (else an error
//                          naming the kernel and the first differing byte)
//   MULTINORM_EMU_SEED     seed of the random order (default 1)
//   MULTINORM_EMU_EDGE_BLOCKS k, MULTINORM_EMU_EDGE_KERNELS a,b: run only the first and last k blocks of
//                          the named kernels' launches (all kernels if no names): the large-shape
//                          tests, which compare only those blocks' rows
//   MULTINORM_EMU_PLANT    a kernel name: its launches skip their last block (a planted wrong kernel,
//                          which `multinorm doctor` must catch and name; tests only)
//   MULTINORM_EMU_REFUSE_WHILE 1: cudaGraphAddNode refuses WHILE nodes, as a driver without them
//                          would (tests of the backend's way around it)
//   MULTINORM_EMU_RACECHECK 0 turns off the race, initialisation and alignment checks (racecheck.h)
//   MULTINORM_EMU_STACK_KB fiber stack size (default 256)
//   MULTINORM_EMU_LAUNCH_LOG a file: the name of each kernel launched, once per process, appended
#pragma once
#ifdef __CUDACC__
#error "cuda_emulation.h is the g++ side of kernels/cuda/cuda_compat.h; nvcc uses the real CUDA headers"
#endif

#include <cuda_bf16.h>          // the real __nv_bfloat16 (host conversions round to nearest even)
#include <cuda_runtime_api.h>   // the real types (dim3, cudaError_t, ...); the host API is emulated

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <type_traits>

// Static shared memory: one instance per worker thread = per running block (a fiber never moves to
// another OS thread). It keeps the previous block's contents, so a read before any write is caught by
// racecheck's shadow (racecheck.h), which starts every block empty.
#undef __shared__
#define __shared__ static thread_local

namespace cuda_emu {

// ---- what the running fiber sees ---------------------------------------------------------------
// `const`: within one CUDA thread's run of a kernel (one fiber) the answers never change, so the
// compiler may hoist them out of loops (a grid-stride loop otherwise calls grid_dim() per element).
__attribute__((const)) const uint3& thread_idx();
__attribute__((const)) const uint3& block_idx();
__attribute__((const)) const dim3& block_dim();
__attribute__((const)) const dim3& grid_dim();
void* dynamic_shared();  // this block's dynamic shared memory (NaN-poisoned at block start)

void syncthreads();
enum class WarpOp : uint8_t { Sync, ShflIdx, ShflUp, ShflDown, ShflXor, Ballot, Any, All, ReduceAdd, ReduceMin, ReduceMax, Exchange };
// One lane's part of a warp collective: returns when every lane of `mask` has arrived (with the same
// mask and op); the last arrival computes every participant's result.
uint64_t warp_collective(WarpOp op, unsigned mask, uint64_t value, int arg, int width);
// A warp-wide all-gather of `bytes` per lane (the warp-matrix instructions of warp_matrix.cuh): returns
// the lanes' contributions, lane k's at offset k * bytes (lanes outside `mask` zero). Valid until the
// warp's next collective. Like a shuffle, it does not order memory between lanes.
const void* warp_exchange(unsigned mask, const void* mine, int bytes);
// cp.async.cg.shared.global (16 bytes; src_bytes < 16 zero-fills the rest), commit_group and
// wait_group, per CUDA thread as on a GPU: a copy's bytes land in shared memory only when a
// wait_group lets its group (older than the `pending` newest) complete, written then by the issuing
// thread (a __syncthreads must follow before other threads read them). Under racecheck, touching
// the destination before it lands is an error; without it the old bytes are seen.
void async_copy(void* shared_dst, const void* global_src, int src_bytes);
void async_commit();
void async_wait(int pending);
// Whether [p, p + bytes) lies in the running block's shared memory (static or dynamic), which
// ldmatrix requires; true when racecheck is off (it keeps the ranges).
bool is_shared_address(const void* p, size_t bytes);

// ---- launching -----------------------------------------------------------------------------------
// Runs body() once per CUDA thread of every block; throws std::runtime_error naming the kernel on an
// invalid launch or a strict-mode error inside it. Synchronous (so stream order is kept trivially).
// `fn` is the kernel's address: its ptxas figures and cudaFuncSetAttribute limits are found by it.
void launch(const char* name, const void* fn, dim3 grid, dim3 block, size_t shared_bytes, const std::function<void()>& body);
// A pointer argument of a launch (argument `index`, of C++ type `type_name` as typeid names it) must
// be null or reachable by a kernel: inside a live device allocation (one past its end included) or
// pinned host memory. Else throws std::runtime_error naming the argument, its address and what it is
// (device_memory.h's describe): on a GPU the kernel faults where it dereferences it.
void check_pointer_argument(int index, const char* type_name, const void* p);
// body() calls these around the kernel's own code, once its arguments are copied onto the thread's
// stack (`arguments`, their copy): racecheck checks the reach of every access in between (racecheck.h).
void kernel_entry(const void* arguments);
void kernel_exit();

// ---- stream capture (CUDA graphs) ----------------------------------------------------------------
// While a stream captures (cudaStreamBeginCapture .. cudaStreamEndCapture), the work issued to it
// (launches, cuBLASLt calls, memsets, copies within device memory or to and from pinned host memory)
// is recorded instead of run, and cudaGraphLaunch runs the recorded work in order. True when
// `stream` is capturing and `work` was recorded.
bool record_if_capturing(cudaStream_t stream, std::function<void()> work);
// Graph launches so far (the tests count replays).
int64_t graph_launches();
// Runs of conditional (WHILE) node bodies so far (the tests count a device loop's iterations).
int64_t conditional_bodies();
// The emulated GPUs: MULTINORM_EMU_DEVICES of them (default 1; a sweep's placement test asks for
// more), those CUDA_VISIBLE_DEVICES lists when it is set, as on a real machine. All share the host.
int visible_devices();
int physical_device(int device);  // the id CUDA_VISIBLE_DEVICES gave visible device `device`
// For tests: n visible devices 0..n-1 from now on (0: back to the environment's).
void set_device_count_for_test(int n);

// ---- atomics: a CAS loop on the raw bits (correct across worker threads) ------------------------
template <class T, class F>
T atomic_update(T* address, F f) {
  static_assert(sizeof(T) == 2 || sizeof(T) == 4 || sizeof(T) == 8, "atomic on an unsupported size");
  using Bits = std::conditional_t<sizeof(T) == 2, uint16_t, std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>>;
  Bits* p = reinterpret_cast<Bits*>(address);
  Bits expected = __atomic_load_n(p, __ATOMIC_RELAXED);
  for (;;) {
    T old;
    std::memcpy(&old, &expected, sizeof(T));
    const T next = f(old);
    Bits desired;
    std::memcpy(&desired, &next, sizeof(T));
    if (__atomic_compare_exchange_n(p, &expected, desired, false, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED)) return old;
  }
}

template <class T>
uint64_t to_bits(T v) {
  static_assert(sizeof(T) <= 8, "warp collectives move at most 8 bytes per lane");
  uint64_t b = 0;
  std::memcpy(&b, &v, sizeof(T));
  return b;
}
template <class T>
T from_bits(uint64_t b) {
  T v;
  std::memcpy(&v, &b, sizeof(T));
  return v;
}

}  // namespace cuda_emu

#define threadIdx (::cuda_emu::thread_idx())
#define blockIdx (::cuda_emu::block_idx())
#define blockDim (::cuda_emu::block_dim())
#define gridDim (::cuda_emu::grid_dim())
constexpr int warpSize = 32;

inline void __syncthreads() { ::cuda_emu::syncthreads(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { ::cuda_emu::warp_collective(::cuda_emu::WarpOp::Sync, mask, 0, 0, 32); }
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

template <class T>
T __shfl_sync(unsigned mask, T v, int src_lane, int width = 32) {
  return ::cuda_emu::from_bits<T>(::cuda_emu::warp_collective(::cuda_emu::WarpOp::ShflIdx, mask, ::cuda_emu::to_bits(v), src_lane, width));
}
template <class T>
T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  return ::cuda_emu::from_bits<T>(::cuda_emu::warp_collective(::cuda_emu::WarpOp::ShflUp, mask, ::cuda_emu::to_bits(v), static_cast<int>(delta), width));
}
template <class T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  return ::cuda_emu::from_bits<T>(::cuda_emu::warp_collective(::cuda_emu::WarpOp::ShflDown, mask, ::cuda_emu::to_bits(v), static_cast<int>(delta), width));
}
template <class T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  return ::cuda_emu::from_bits<T>(::cuda_emu::warp_collective(::cuda_emu::WarpOp::ShflXor, mask, ::cuda_emu::to_bits(v), lane_mask, width));
}
inline unsigned __ballot_sync(unsigned mask, int pred) {
  return static_cast<unsigned>(::cuda_emu::warp_collective(::cuda_emu::WarpOp::Ballot, mask, pred != 0, 0, 32));
}
inline int __any_sync(unsigned mask, int pred) {
  return static_cast<int>(::cuda_emu::warp_collective(::cuda_emu::WarpOp::Any, mask, pred != 0, 0, 32));
}
inline int __all_sync(unsigned mask, int pred) {
  return static_cast<int>(::cuda_emu::warp_collective(::cuda_emu::WarpOp::All, mask, pred != 0, 0, 32));
}
// sm_80 integer warp reductions
inline unsigned __reduce_add_sync(unsigned mask, unsigned v) {
  return static_cast<unsigned>(::cuda_emu::warp_collective(::cuda_emu::WarpOp::ReduceAdd, mask, v, 0, 32));
}
inline unsigned __reduce_min_sync(unsigned mask, unsigned v) {
  return static_cast<unsigned>(::cuda_emu::warp_collective(::cuda_emu::WarpOp::ReduceMin, mask, v, 0, 32));
}
inline unsigned __reduce_max_sync(unsigned mask, unsigned v) {
  return static_cast<unsigned>(::cuda_emu::warp_collective(::cuda_emu::WarpOp::ReduceMax, mask, v, 0, 32));
}

template <class T>
T atomicAdd(T* a, T v) {
  return ::cuda_emu::atomic_update(a, [v](T old) { return static_cast<T>(old + v); });
}
template <class T>
T atomicMax(T* a, T v) {
  return ::cuda_emu::atomic_update(a, [v](T old) { return old < v ? v : old; });
}
template <class T>
T atomicMin(T* a, T v) {
  return ::cuda_emu::atomic_update(a, [v](T old) { return v < old ? v : old; });
}
template <class T>
T atomicExch(T* a, T v) {
  return ::cuda_emu::atomic_update(a, [v](T) { return v; });
}
template <class T>
T atomicCAS(T* a, T compare, T v) {
  return ::cuda_emu::atomic_update(a, [compare, v](T old) { return old == compare ? v : old; });
}

// Device math intrinsics. The GPU's are approximations; tests compare by tolerance. __expf runs as
// the GPU runs it, 2^(x log2 e) with the product rounded to FP32 (ex2.approx after an FP32 multiply):
// the error that grows with |x| (about |x| ulps: 2 + floor(1.173 |x|) is CUDA's stated bound) is the GPU's,
// so a test's bound set here holds there; 2^y itself exact, as fast_exp2's ex2.approx is taken.
inline float __expf(float x) { return std::exp2(x * 1.44269504088896341f); }
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline long long __double_as_longlong(double x) {
  long long r;
  std::memcpy(&r, &x, sizeof r);
  return r;
}
inline double __longlong_as_double(long long x) {
  double r;
  std::memcpy(&r, &x, sizeof r);
  return r;
}
// A WHILE node's condition, set by a kernel of its graph (the device runtime's builtin under nvcc).
void cudaGraphSetConditional(cudaGraphConditionalHandle handle, unsigned int value);
template <class T>
T __ldg(const T* p) {
  return *p;
}
