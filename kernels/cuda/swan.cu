// SWAN on a chunk of B matrices W_b, G_b [m_b, n_b] of one Gram size k = min(m_b, n_b) (the algorithm,
// its guards and its CPU twin: kernels/cpu/swan.cpp). Per matrix, as the CPU does it:
//   X = row-normalised G (l2 to sqrt(n), or standardised), FP32        one kernel, a block per row
//   A = X X^T (m <= n) or X^T X (m > n)                                  cuBLASLt, FP32
//   A += (1e-6 ||A||_F + eps) I; c = min(||A||_F, max_i sum_j |A_ij|)   FP64 reductions
//   Newton-Schulz: Y0 = A / c, Z0 = I; P = Z Y, T = a I - b P, Y <- Y T, Z <- T Z
//     scaled: (a, b) from the spectrum's lower bound, sqrt(reg / c) at first (optim_math::ns_step)
//   U = sqrt(max(m, n)) Z X (or X Z) / sqrt(c);  W <- W (1 - lr wd) - lr U
// Batched: every k x k step is one strided-batched cuBLASLt call for the whole chunk (a kernel's
// grid has a y-row per matrix), and the Gram matrices and U one per run of one shape (a chunk is
// ordered by shape: cuda_scratch::swan_plan), so a model's matrices take a handful of launches a
// step, not one per matrix.
// Decided on the device, with no host wait (the update can be captured in a graph):
//   - convergence: each step's residual ||I - Z Y||_F / sqrt(k) is reduced per matrix; a matrix whose
//     residual is under ns_tolerance is done, where the CPU would stop, and from then on its T is the
//     identity, so Y T = Y and T Z = Z exactly (FP32 products with 0 and 1) and its iterate stays
//     as it was (split TF32 products: its halves are kept and Z put back, ns_split_kernel). In a
//     graph the steps are a device loop (a WHILE node, two steps a body, each step checked at its
//     end) that ends once every matrix of the chunk is done: the chunk pays its slowest matrix's
//     steps, and one frozen step where that count is odd, not ns_steps. Run eagerly (profiling, no
//     graphs) or where the loop is not captured (a CUDA 12 build, a runtime refusing it) every one of
//     ns_steps runs, frozen matrices unchanged, so the results are the same bits either way.
//   - split TF32 products (from k = cuda_scratch::kSwanSplitTf32MinK by default): Y, Z and T are
//     also kept as halves hi + lo, both TF32 (optim_math::split_tf32), and each product is three
//     TF32 tensor-core products of them (LtGemm::run_batched_split_tf32); T's halves come with T,
//     Y's and Z's from one split kernel a step.
//   - the fallback: a matrix whose residual or U is not finite takes the exact path. Its apply kernel
//     copies X into pinned host memory and raises a flag there; a host function in stream order
//     (cudaLaunchHostFunc: a host node in a graph) computes the FP64 polar factor on the host
//     (kernels/common/polar_exact.h) when the flag is up and returns at once otherwise; the next
//     kernel applies it. The rare case costs the host's LAPACK call, the common one a host node.
//   - the skip flag: every apply kernel reads the update's statistics and changes nothing when they
//     say skip; the statistics kernel then counts nothing.
// whitening=eigh takes the exact path for every matrix the same way.
// Cost per step: 3 batched GEMMs of B x 2 k^3 FLOPs (the first step 2: Z0 = I; split TF32: 3 TF32
// GEMMs each); the Gram matrix and U: 2 m n k FLOPs each; the element-wise passes read and write k^2 floats per matrix (cost model:
// src/bench/kernel_costs.cpp).
#include <cmath>
#include <vector>

#include "../common/optim_math.h"
#include "../common/polar_exact.h"
#include "check.h"
#include "device_utils.cuh"
#include "gemm.h"
#include "kernels.h"
#include "multinorm/cuda_scratch.h"

namespace multinorm::cuda {

// One matrix's state on the device (cuda_scratch::kSwanStateBytes).
struct SwanState {
  double frob2, c, residual;
  double lower;                 // the Newton-Schulz spectrum's lower bound before the next step (optim_math::ns_step)
  unsigned long long row_max;   // A's largest absolute row sum, FP64 bits (non-negative: ordered as integers)
  float reg;                    // what the regularisation added to A's diagonal
  uint32_t done, steps, nonfinite, fallback;  // fallback: 0 none, 2 the exact result applied, 3 the exact path failed
  uint32_t chunk_step;  // the first matrix's only: the chunk's Newton-Schulz step, advanced on the device
};
static_assert(sizeof(SwanState) <= cuda_scratch::kSwanStateBytes, "SwanState fits its slot");

// The exact path's staging in pinned host memory: flag (1: X staged, 2: U ready, 3: failed), then
// X as m n floats, overwritten by U as m n doubles.
struct SwanExactJob {
  volatile uint32_t* flag;
  float* x;
  double* u;
  int64_t m, n;
};
// A group of a chunk's matrices staged at once (cuda_scratch::swan_exact_groups), one host function
// for all: each job at the sum of the ones before it in the pinned region.
struct SwanExactGroup {
  std::vector<SwanExactJob> jobs;
};

// One matrix of a chunk as its per-matrix kernels take them, every matrix in one launch (blockIdx.y
// the matrix; the table in device memory, uploaded once: the descriptor cache).
struct SwanMatrix {
  void* w;
  const void* g;
  float *x, *u;  // X and U in the chunk's scratch, rows of ld
  int64_t m, n, ld;
  int64_t arena_ld;  // w's and g's rows (n, or a padded arena's)
  uint64_t tensor;  // its stochastic rounding's tensor id
  float sqrt_n, sqrt_max;  // sqrt(n) (the l2 rows' norm), sqrt(max(m, n)) (||U||_F = sqrt(mn)), rounded on the host
  SwanExactJob job;  // its exact-path staging
};

namespace {

constexpr int kThreads = 256;
constexpr int64_t kReduceBlocks = cuda_scratch::kSwanReduceBlocks;
static_assert(kThreads == 256, "cuda_scratch::swan_reduce_blocks counts 256 elements a block");

// Grid (rows of the tallest matrix, B): row blockIdx.x of matrix b normalised into X (a block a row;
// a block past its matrix's rows returns whole).
template <class G>
__global__ void normalize_rows_kernel(const SwanMatrix* mats, bool standardize, float eps) {
  __shared__ double dscratch[32];
  __shared__ float fscratch[32];
  const SwanMatrix& t = mats[blockIdx.y];
  const int64_t i = blockIdx.x, n = t.n;
  if (i >= t.m) return;
  const G* gi = static_cast<const G*>(t.g) + i * t.arena_ld;
  float* xi = t.x + i * t.ld;
  if (standardize) {  // (g - mean) / std, statistics in FP64 as on the CPU
    double s = 0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) s += to_float(gi[j]);
    const double mean = block_sum(s, dscratch) / double(n);
    double v = 0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const double d = to_float(gi[j]) - mean;
      v += d * d;
    }
    const double var = block_sum(v, dscratch) / double(n);
    const float inv = 1.0f / fmaxf(float(sqrt(var)), eps);
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) xi[j] = (to_float(gi[j]) - float(mean)) * inv;
  } else {
    float ss = 0.0f;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) ss += to_float(gi[j]) * to_float(gi[j]);
    const float inv = t.sqrt_n / fmaxf(sqrtf(block_sum(ss, fscratch)), eps);
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) xi[j] = to_float(gi[j]) * inv;
  }
}

// Grid (swan_reduce_blocks(k), B): partial sums over matrix b's k x k elements (at M + b gram): of p^2
// (residual = false) or of (I - P)^2, then T = a I - b P (the step's scaled coefficients) when T is given,
// and its split TF32 halves when Th and Tl are.
__global__ void partial_sums_kernel(double* partials, float* T, float* Th, float* Tl, const float* M, int64_t k, int64_t gram, bool residual,
                                    const SwanState* st) {
  __shared__ double scratch[32];
  const int64_t b = blockIdx.y, total = k * k;
  const float* P = M + b * gram;
  const optim_math::NsStep step = optim_math::ns_step(T ? st[b].lower : 1.0);
  double r2 = 0;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const double p = P[e], eye = residual && e / k == e % k ? 1.0 : 0.0;
    r2 += (eye - p) * (eye - p);
    if (!T) continue;
    const float t = float(step.identity * (e / k == e % k ? 1.0 : 0.0) - step.product * p);
    T[b * gram + e] = t;
    if (Th) {
      const optim_math::Tf32Split h = optim_math::split_tf32(t);
      Th[b * gram + e] = h.hi, Tl[b * gram + e] = h.lo;
    }
  }
  r2 = block_sum(r2, scratch);
  if (threadIdx.x == 0) partials[b * kReduceBlocks + blockIdx.x] = r2;
}

// What the final sum of a matrix's partials becomes.
enum class Reduced : int { Frobenius, ResidualAtStep };

// Grid (1, B): matrix b's partials added in a fixed order. Frobenius: ||A||_F^2; ResidualAtStep: the
// residual at the chunk's step (its first state's chunk_step), and the decision the CPU makes there:
// under the tolerance the matrix is done (its `step` iterations are what it applied), else it applies
// one more. A check at ns_steps or past it (after the last step; a device loop's body is two steps,
// so an odd count ends past it) decides nothing but the residual: the final iterate's; its T is
// frozen (freeze_kernel).
__global__ void reduce_kernel(SwanState* st, const double* partials, int64_t blocks, int64_t k, Reduced what, int ns_steps, float tolerance) {
  __shared__ double scratch[32];
  const int64_t b = blockIdx.y;
  double s = 0;
  for (int64_t i = threadIdx.x; i < blocks; i += blockDim.x) s += partials[b * kReduceBlocks + i];
  s = block_sum(s, scratch);
  if (threadIdx.x != 0) return;
  SwanState& m = st[b];
  if (what == Reduced::Frobenius) {
    m.frob2 = s;
    m.row_max = 0;  // row_sums_kernel's maximum starts here
    return;
  }
  m.residual = sqrt(s / double(k));
  const uint32_t step = st[0].chunk_step;
  if (what != Reduced::ResidualAtStep || m.done || step >= uint32_t(ns_steps)) return;
  if (tolerance > 0 && m.residual < tolerance) m.done = 1, m.steps = step;
  else m.steps = step + 1;
}

// Grid (ceil(k / threads), B): A_b[i,i] += 1e-6 ||A_b||_F + eps (kept in the state: the spectrum's floor)
__global__ void regularize_kernel(float* A, int64_t k, int64_t gram, SwanState* st, float eps) {
  const int64_t b = blockIdx.y, i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const float reg = float(1e-6 * sqrt(st[b].frob2) + eps);
  if (i < k) A[b * gram + i * k + i] += reg;
  if (i == 0) st[b].reg = reg;
}

// Grid (ceil(k / warps), B): the largest absolute row sum of A_b, a warp per row in FP64; the maximum
// over rows by an integer atomicMax on the bits (non-negative doubles order as their bits do, and a
// maximum does not depend on the order: deterministic).
__global__ void row_sums_kernel(SwanState* st, const float* A, int64_t k, int64_t gram) {
  const int64_t b = blockIdx.y, i = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (i >= k) return;
  const float* row = A + b * gram + i * k;
  const int lane = threadIdx.x % 32;
  double s = 0;
  for (int64_t j = lane; j < k; j += 32) s += fabs(double(row[j]));
  s = warp_sum(s);
  if (lane == 0) atomicMax(&st[b].row_max, static_cast<unsigned long long>(__double_as_longlong(s)));
}

// Grid (g, B): c = min(||A||_F, largest absolute row sum), both bounds of A's largest eigenvalue; Y =
// A / c in place (and its split TF32 halves when Yh and Yl are given); Z = I; the spectrum's lower
// bound sqrt(reg / c); the matrix's state starts.
__global__ void ns_init_kernel(float* Y, float* Z, float* Yh, float* Yl, int64_t k, int64_t gram, SwanState* st) {
  const int64_t b = blockIdx.y;
  const double frob = sqrt(st[b].frob2), rows = __longlong_as_double(static_cast<long long>(st[b].row_max));
  const double cc = fmin(frob, rows);
  const int64_t total = k * k;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const float y = float(Y[b * gram + e] / cc);
    Y[b * gram + e] = y;
    Z[b * gram + e] = e / k == e % k ? 1.0f : 0.0f;
    if (Yh) {
      const optim_math::Tf32Split h = optim_math::split_tf32(y);
      Yh[b * gram + e] = h.hi, Yl[b * gram + e] = h.lo;
    }
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    st[b].c = cc;
    st[b].lower = sqrt(double(st[b].reg) / cc);
    st[b].done = st[b].steps = st[b].nonfinite = st[b].fallback = st[b].chunk_step = 0;
  }
}

// Grid (swan_reduce_blocks(k), B): a done matrix's T is the identity (its iterate stays as it is),
// and every matrix's at a step past ns_steps. Few blocks a matrix: most steps most matrices' blocks
// only read their state and return, and a grid of k^2 / 256 blocks a matrix took 27 us a launch on an
// H200 at the quickstart's 56 matrices of k = 384 (0.32 ms over 12 steps).
// (Split TF32: T's halves I and 0 too.)
__device__ bool frozen(const SwanState* st, int64_t b, int ns_steps) { return st[b].done || st[0].chunk_step >= uint32_t(ns_steps); }
__global__ void freeze_kernel(float* T, float* Th, float* Tl, int64_t k, int64_t gram, const SwanState* st, int ns_steps) {
  const int64_t b = blockIdx.y;
  if (!frozen(st, b, ns_steps)) return;
  const int64_t total = k * k;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const float eye = e / k == e % k ? 1.0f : 0.0f;
    T[b * gram + e] = eye;
    if (Th) Th[b * gram + e] = eye, Tl[b * gram + e] = 0.0f;
  }
}

// Grid (g, B), split TF32 only, once a step's Y T and T Z are in: the new Y and Z
// into their halves. A frozen matrix (as freeze_kernel's T said: T = I) keeps its halves, and its Z
// is put back from Z_prev (the previous iterate, still in the ping-pong partner): products of
// halves by I return hi + lo, not the FP32 value they split, so a frozen iterate stays exactly as it
// was, as with FP32 products (U takes Z; the products only the halves).
__global__ void ns_split_kernel(const float* Y, float* Z, const float* Z_prev, float* Yh, float* Yl, float* Zh, float* Zl, int64_t k, int64_t gram,
                                const SwanState* st, int ns_steps) {
  const int64_t b = blockIdx.y, total = k * k;
  const bool keep = frozen(st, b, ns_steps);
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = b * gram + e;
    if (keep) {
      Z[i] = Z_prev[i];
      continue;
    }
    const optim_math::Tf32Split y = optim_math::split_tf32(Y[i]), z = optim_math::split_tf32(Z[i]);
    Yh[i] = y.hi, Yl[i] = y.lo, Zh[i] = z.hi, Zl[i] = z.lo;
  }
}

// One block, a thread a matrix (a chunk holds at most kSwanChunkTensors), once a Newton-Schulz step
// is applied: every matrix's spectrum bound, then (after a barrier: every thread has read its state)
// the chunk's step advanced by thread 0. (It was one thread over the matrices: 32 us a launch on an
// H200 at 56 of them.)
static_assert(cuda_scratch::kSwanChunkTensors <= kThreads, "a thread per matrix of a chunk");
__global__ void ns_step_end_kernel(SwanState* st, int64_t B) {
  const int64_t b = threadIdx.x;
  if (b < B) st[b].lower = optim_math::ns_step(st[b].lower).next_lower;
  __syncthreads();
  if (threadIdx.x == 0) ++st[0].chunk_step;
}

// One block, a thread a matrix, at the end of a device loop's body (after its last check): whether
// the body runs again: while a step is left and some matrix is not done. Those are the steps the CPU
// would run for its slowest matrix. (Run eagerly, with no loop's handle, it decides nothing.)
__global__ void ns_loop_kernel(const SwanState* st, int64_t B, int ns_steps, cudaGraphConditionalHandle loop) {
  __shared__ int scratch[32];
  const int open = threadIdx.x < B && !st[threadIdx.x].done ? 1 : 0;
  const int not_done = block_sum(open, scratch);
  if (threadIdx.x == 0 && loop != 0) cudaGraphSetConditional(loop, not_done > 0 && st[0].chunk_step < uint32_t(ns_steps) ? 1u : 0u);
}

// Grid (g, B): non-finite entries of matrix b's U -> st[b].nonfinite (deterministic: an integer count)
__global__ void count_nonfinite_kernel(SwanState* st, const SwanMatrix* mats) {
  const SwanMatrix& t = mats[blockIdx.y];
  const int64_t n = t.n, ld = t.ld, total = t.m * n;
  const float* u = t.u;
  unsigned local = 0;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x)
    local += !isfinite(u[(e / n) * ld + e % n]);
  if (local) atomicAdd(&st[blockIdx.y].nonfinite, local);  // an integer: order-independent
}

// Grid (g, matrices b0 ..): Newton-Schulz's result, when finite: W <- W keep - lr sqrt(max(m, n)) /
// sqrt(c) U (the lr, keep and write step from the update's scalars when given: take_update_scalars).
// Otherwise (or on the exact path) X is staged for the host function, flag 1. A skipped update
// changes nothing and stages nothing.
template <class T>
__global__ void swan_apply_kernel(const SwanMatrix* mats, int64_t b0, const SwanState* states, bool exact, RuleScalars r, WriteBack wb,
                                  const UpdateScalars* s, int slot) {
  const SwanMatrix& t = mats[b0 + blockIdx.y];
  const SwanState* st = states + b0 + blockIdx.y;
  const bool skip = s && s->stats.skip;
  const bool ok = !exact && st->nonfinite == 0 && isfinite(st->residual);
  if (blockIdx.x == 0 && threadIdx.x == 0) *t.job.flag = skip || ok ? 0u : 1u;
  if (skip) return;
  // (the table's fields in registers: a store to w may alias the table for all the compiler knows)
  const int64_t m = t.m, n = t.n, ld = t.ld, wld = t.arena_ld, total = m * n;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const float *x = t.x, *u = t.u;
  if (!ok) {
    float* staged = t.job.x;
    for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total; e += stride) staged[e] = x[(e / n) * ld + e % n];
    return;
  }
  wb.tensor = t.tensor;
  take_update_scalars(s, slot, r, wb);
  const float keep = r.keep, step = r.lr * t.sqrt_max;
  const float scale = step * float(1.0 / sqrt(st->c));
  T* w = static_cast<T*>(t.w);
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total; e += stride) {
    const int64_t i = e / n, j = e - i * n;
    w[i * wld + j] = store_weight<T>(to_float(w[i * wld + j]) * keep - scale * u[i * ld + j], wb, static_cast<uint64_t>(e));
  }
}

// A thread a matrix b0 + i: the host function's verdict into the matrix's state (device memory). The
// flag lives in pinned host memory: read once here, not by every thread of the apply kernel (each
// such read is a PCIe round trip: on an H100 they made the update 25x its prediction, gpu_check
// 2026-11-27).
__global__ void swan_exact_verdict_kernel(SwanState* states, const SwanMatrix* mats, int64_t b0, int64_t count) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= count) return;
  const uint32_t flag = *mats[b0 + i].job.flag;
  states[b0 + i].fallback = flag >= 2 ? flag : 0u;
}

// Grid (g, matrices b0 ..): the host function's result, applied where it is ready (fallback 2), in
// FP64 as on the CPU.
template <class T>
__global__ void swan_apply_exact_kernel(const SwanMatrix* mats, int64_t b0, const SwanState* states, RuleScalars r, WriteBack wb, const UpdateScalars* s,
                                        int slot) {
  const SwanMatrix& t = mats[b0 + blockIdx.y];
  wb.tensor = t.tensor;
  if (states[b0 + blockIdx.y].fallback != 2 || !take_update_scalars(s, slot, r, wb)) return;
  const float keep = r.keep;
  const double step = r.lr * t.sqrt_max;
  T* w = static_cast<T*>(t.w);
  const double* exact = t.job.u;
  const int64_t n = t.n, wld = t.arena_ld, total = t.m * n;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t at = e / n * wld + e % n;
    w[at] = store_weight<T>(float(to_float(w[at]) * keep - step * exact[e]), wb, static_cast<uint64_t>(e));
  }
}

// One thread: the chunk's matrices into the update's statistics (optim_math::add_swan_tensor, as the
// CPU backend adds them), unless the update is skipped.
__global__ void swan_statistics_kernel(SwanStats* out, const SwanState* st, int64_t count, bool exact, float tolerance, const UpdateScalars* s) {
  if (s && s->stats.skip) return;
  for (int64_t b = 0; b < count; ++b) {
    if (st[b].fallback == 3) {
      out->tensors += 1;
      out->exact_failures += 1;
    } else if (exact) {
      optim_math::add_swan_tensor(*out, 0.0, false, 0, 0.0f);
    } else {
      optim_math::add_swan_tensor(*out, st[b].residual, st[b].fallback == 2, static_cast<int>(st[b].steps), tolerance);
    }
  }
}

// The host function of a group: the exact FP64 polar factor of each staged X (flag 1), nothing for
// the others. No CUDA call here (CUDA forbids them in a host function); a failure is a flag the
// device reads.
void CUDART_CB swan_exact_on_host(void* data) {
  for (SwanExactJob& j : static_cast<SwanExactGroup*>(data)->jobs) {
    if (*j.flag != 1) continue;
    try {
      const int64_t m = j.m, n = j.n, k = std::min(m, n);
      std::vector<float> x(j.x, j.x + m * n);  // U overwrites X's bytes
      std::vector<double> M(m * n), A(k * k + k), B(k * k), Z(k * k);
      polar_exact_fp64(j.u, x.data(), m, n, M.data(), A.data(), B.data(), Z.data());
      *j.flag = 2;
    } catch (...) {
      *j.flag = 3;
    }
  }
}

unsigned grid_for(int64_t n) { return static_cast<unsigned>(std::min<int64_t>(ceil_div(n, kThreads), 4096)); }

}  // namespace

SwanExactGroup* swan_exact_group(void* pinned, const std::vector<std::pair<int64_t, int64_t>>& shapes) {
  auto* g = new SwanExactGroup;
  char* at = static_cast<char*>(pinned);
  for (const auto& [m, n] : shapes) {
    g->jobs.push_back({reinterpret_cast<volatile uint32_t*>(at), reinterpret_cast<float*>(at + 64), reinterpret_cast<double*>(at + 64), m, n});
    at += cuda_scratch::swan_pinned_bytes(m, n);
  }
  return g;
}
void swan_exact_group_free(SwanExactGroup* group) { delete group; }

namespace {

// A chunk's scratch (cuda_scratch::swan_tensor_bytes per matrix): X and U per matrix, then the
// batched k x k matrices, the partial sums and the states.
struct Chunk {
  int64_t B, k, gram;
  std::vector<float*> X, U;
  float *Y, *Z, *P, *T, *spare;  // Y holds the Gram matrices first; P is Y's ping-pong partner, spare Z's
  bool split;                    // split TF32 products (cuda_scratch::swan_split_tf32): the halves of Y, Z and T, else null
  float *Yh = nullptr, *Yl = nullptr, *Zh = nullptr, *Zl = nullptr, *Th = nullptr, *Tl = nullptr;
  double* partials;
  SwanState* st;
};
Chunk chunk_layout(const SwanItem* items, int64_t B, bool split, void* scratch) {
  namespace cs = cuda_scratch;
  Chunk c;
  c.B = B, c.k = std::min(items[0].m, items[0].n), c.gram = cs::swan_gram_floats(c.k), c.split = split;
  float* cursor = static_cast<float*>(scratch);
  for (int64_t b = 0; b < B; ++b) c.X.push_back(cursor), cursor += cs::swan_x_floats(items[b].m, items[b].n);
  for (int64_t b = 0; b < B; ++b) c.U.push_back(cursor), cursor += cs::swan_x_floats(items[b].m, items[b].n);
  for (float** m : {&c.Y, &c.Z, &c.P, &c.T, &c.spare}) *m = cursor, cursor += B * c.gram;
  if (split)
    for (float** m : {&c.Yh, &c.Yl, &c.Zh, &c.Zl, &c.Th, &c.Tl}) *m = cursor, cursor += B * c.gram;
  c.partials = reinterpret_cast<double*>(cursor);
  c.st = reinterpret_cast<SwanState*>(c.partials + B * kReduceBlocks);
  return c;
}

// The chunk's Gram matrices (in Y) to their inverse square roots (scaled by sqrt(c): in Z), every
// matrix's decisions on the device; its residual and steps in its state. The steps run in bodies of
// two: Y trades places with P and Z with spare at every step, so after two each buffer is where it
// started and one body serves every run. The first check and two steps run before the bodies (the
// first step two products: Z0 = I). In a graph the bodies are a device loop (a WHILE node) that ends
// once every matrix is done; run eagerly, all floor((ns_steps - 1) / 2) bodies run (done matrices
// frozen), with the same results.
void inverse_sqrt_batched(Chunk& c, const SwanParams& a, LtGemm& gemm, const DeviceLoop& loop, cudaStream_t stream) {
  const int64_t B = c.B, k = c.k, gram = c.gram;
  const dim3 per_k(ceil_div(k, kThreads), static_cast<unsigned>(B)), per_gram(grid_for(k * k), static_cast<unsigned>(B));
  const int64_t blocks = cuda_scratch::swan_reduce_blocks(k);
  const dim3 reduce_grid(static_cast<unsigned>(blocks), static_cast<unsigned>(B)), one_per_matrix(1, static_cast<unsigned>(B));
  auto reduce = [&](const float* M, bool make_T, bool residual, Reduced what, cudaStream_t s) {
    float *T = make_T ? c.T : nullptr, *Th = make_T ? c.Th : nullptr, *Tl = make_T ? c.Tl : nullptr;
    launch("swan_partial_sums", partial_sums_kernel, reduce_grid, dim3(kThreads), 0, s, c.partials, T, Th, Tl, M, k, gram, residual, c.st);
    launch("swan_reduce", reduce_kernel, one_per_matrix, dim3(kThreads), 0, s, c.st, c.partials, blocks, k, what, a.ns_steps, a.ns_tolerance);
  };
  reduce(c.Y, false, false, Reduced::Frobenius, stream);
  launch("swan_regularize", regularize_kernel, per_k, dim3(kThreads), 0, stream, c.Y, k, gram, c.st, a.eps);
  reduce(c.Y, false, false, Reduced::Frobenius, stream);  // ||A||_F after regularisation, as on the CPU
  launch("swan_row_sums", row_sums_kernel, dim3(ceil_div(k, kThreads / 32), static_cast<unsigned>(B)), dim3(kThreads), 0, stream, c.st, c.Y, k,
         gram);
  launch("swan_ns_init", ns_init_kernel, per_gram, dim3(kThreads), 0, stream, c.Y, c.Z, c.Yh, c.Yl, k, gram, c.st);
  // An iterate's check: P's residual (P = Z Y; Y0 itself at first, Z0 = I) and the next step's T
  // from it, each matrix's decision at the chunk's step, the done matrices' T frozen.
  auto check = [&](const float* P, cudaStream_t s) {
    reduce(P, true, true, Reduced::ResidualAtStep, s);
    launch("swan_freeze", freeze_kernel, reduce_grid, dim3(kThreads), 0, s, c.T, c.Th, c.Tl, k, gram, c.st, a.ns_steps);
  };
  // out = a b for the chunk's k x k matrices: one FP32 product, or split TF32's three of their halves.
  struct Operand {
    const float *x, *hi, *lo;
  };
  auto multiply = [&](float* out, Operand x, Operand y, cudaStream_t s) {
    if (c.split) gemm.run_batched_split_tf32(out, x.hi, x.lo, y.hi, y.lo, k, k, k, B, gram, s);
    else gemm.run_batched(out, x.x, y.x, k, k, k, B, gram, s);
  };
  // A step: Y <- Y T and Z <- T Z (the first, Z0 = I: Z <- T, T's buffer: a product with the identity
  // is exact in FP32 for finite values, the CPU's bits), the bound and the chunk's step advanced,
  // then the new iterate's check. Checking at a step's end, not its start, lets a loop's body end on
  // the check that finds every matrix done.
  // Split TF32: the new Y and Z split into their halves before the check's product (Y's in place:
  // the step's products have read them), a frozen matrix's Z put back from the previous iterate.
  auto step = [&](cudaStream_t s, bool first) {
    multiply(c.P, {c.Y, c.Yh, c.Yl}, {c.T, c.Th, c.Tl}, s);  // Y <- Y T, into P (T holds all P was needed for)
    std::swap(c.Y, c.P);
    const float* z_prev = nullptr;  // where the previous Z is once the new one is in
    if (first) {
      std::swap(c.Z, c.T), std::swap(c.Zh, c.Th), std::swap(c.Zl, c.Tl);
      z_prev = c.T;
    } else {
      multiply(c.spare, {c.T, c.Th, c.Tl}, {c.Z, c.Zh, c.Zl}, s);  // Z <- T Z
      std::swap(c.Z, c.spare);
      z_prev = c.spare;
    }
    if (c.split)
      launch("swan_ns_split", ns_split_kernel, per_gram, dim3(kThreads), 0, s, c.Y, c.Z, z_prev, c.Yh, c.Yl, c.Zh, c.Zl, k, gram, c.st, a.ns_steps);
    launch("swan_ns_step_end", ns_step_end_kernel, dim3(1), dim3(kThreads), 0, s, c.st, B);
    multiply(c.P, {c.Z, c.Zh, c.Zl}, {c.Y, c.Yh, c.Yl}, s);  // P = Z Y
    check(c.P, s);
  };
  auto body = [&](cudaStream_t s, cudaGraphConditionalHandle handle) {
    step(s, false), step(s, false);
    launch("swan_ns_loop", ns_loop_kernel, dim3(1), dim3(kThreads), 0, s, c.st, B, a.ns_steps, handle);
  };
  // The first check, steps 1 and 2 before the loop, then bodies of two (the buffers back where they
  // were after each). The last check leaves each matrix's residual that of its final iterate.
  check(c.Y, stream);
  if (a.ns_steps >= 1) step(stream, true);
  if (a.ns_steps >= 2) step(stream, false);
  const int bodies = std::max(0, a.ns_steps - 1) / 2;
  if (bodies > 0 && !(loop && loop(body)))
    for (int i = 0; i < bodies; ++i) body(stream, 0);
}

// Per run of one shape (cuda_scratch::swan_shape_runs: evenly strided X, U and k x k matrices), one
// strided-batched GEMM: the Gram matrices A = X X^T (m <= n) or X^T X into Y, or U = Z X or X Z.
void gram_batched(const Chunk& c, int64_t b0, int64_t count, int64_t m, int64_t n, LtGemm& gemm, cudaStream_t stream) {
  namespace cs = cuda_scratch;
  const int64_t ld = cs::swan_ld(n), xs = cs::swan_x_floats(m, n), k = c.k;
  float* A = c.Y + b0 * c.gram;
  if (m <= n) gemm.run_batched(A, k, c.gram, c.X[b0], ld, xs, c.X[b0], ld, xs, m, m, n, false, true, count, stream);
  else gemm.run_batched(A, k, c.gram, c.X[b0], ld, xs, c.X[b0], ld, xs, n, n, m, true, false, count, stream);
}
void u_batched(const Chunk& c, int64_t b0, int64_t count, int64_t m, int64_t n, LtGemm& gemm, cudaStream_t stream) {
  namespace cs = cuda_scratch;
  const int64_t ld = cs::swan_ld(n), xs = cs::swan_x_floats(m, n), k = c.k;
  const float* Z = c.Z + b0 * c.gram;
  if (m <= n) gemm.run_batched(c.U[b0], ld, xs, Z, k, c.gram, c.X[b0], ld, xs, m, n, m, false, false, count, stream);
  else gemm.run_batched(c.U[b0], ld, xs, c.X[b0], ld, xs, Z, k, c.gram, m, n, n, false, false, count, stream);
}

}  // namespace

template <class T, class G>
void swan_chunk(const SwanItem* items, int64_t B, const SwanParams& a, LtGemm& gemm, void* scratch, SwanExactGroup* const* groups,
                const DeviceLoop& loop, const Upload& upload, cudaStream_t stream) {
  namespace cs = cuda_scratch;
  Chunk c = chunk_layout(items, B, cs::swan_split_tf32(swan_split_from_k(a.ns_products), std::min(items[0].m, items[0].n)), scratch);
  const auto shape = [&](int64_t b) { return std::pair<int64_t, int64_t>{items[b].m, items[b].n}; };
  const auto runs = cs::swan_shape_runs(B, shape), exact_groups = cs::swan_exact_groups(B, shape);
  // The matrices' table, each with its exact-path job (its group's, in chunk order).
  std::vector<SwanMatrix> table;
  int64_t rows = 0, most = 0;
  for (size_t g = 0; g < exact_groups.size(); ++g)
    for (int64_t b = exact_groups[g].first; b < exact_groups[g].second; ++b) {
      const SwanItem& t = items[b];
      table.push_back({t.w, t.g, c.X[b], c.U[b], t.m, t.n, cs::swan_ld(t.n), t.ld, t.tensor, std::sqrt(static_cast<float>(t.n)),
                       std::sqrt(static_cast<float>(std::max(t.m, t.n))), groups[g]->jobs[static_cast<size_t>(b - exact_groups[g].first)]});
      rows = std::max(rows, t.m), most = std::max(most, t.m * t.n);
    }
  const auto* mats = static_cast<const SwanMatrix*>(upload(table.data(), table.size() * sizeof(SwanMatrix)));
  const unsigned per_matrix = grid_for(most);
  launch("swan_normalize_rows", normalize_rows_kernel<G>, dim3(static_cast<unsigned>(rows), static_cast<unsigned>(B)), dim3(kThreads), 0, stream, mats,
         a.standardize, a.eps);
  if (!a.exact) {
    for (const auto& [b0, b1] : runs) gram_batched(c, b0, b1 - b0, items[b0].m, items[b0].n, gemm, stream);
    inverse_sqrt_batched(c, a, gemm, loop, stream);
    for (const auto& [b0, b1] : runs) u_batched(c, b0, b1 - b0, items[b0].m, items[b0].n, gemm, stream);
    launch("swan_count_nonfinite", count_nonfinite_kernel, dim3(per_matrix, static_cast<unsigned>(B)), dim3(kThreads), 0, stream, c.st, mats);
  }
  // Per exact-path group: the apply (staging X where a matrix falls back), the host function, its
  // verdicts and the exact results applied.
  const RuleScalars rule = optim_math::rule_scalars(a.lr, a.decoupled_decay);
  for (size_t g = 0; g < exact_groups.size(); ++g) {
    const int64_t b0 = exact_groups[g].first, count = exact_groups[g].second - b0;
    const dim3 grid(per_matrix, static_cast<unsigned>(count));
    launch("swan_apply", swan_apply_kernel<T>, grid, dim3(kThreads), 0, stream, mats, b0, c.st, a.exact, rule, a.write, a.scalars.at, a.scalars.slot);
    MN_CUDA_CHECK(cudaLaunchHostFunc(stream, swan_exact_on_host, groups[g]), "swan's exact path (a host function)");
    launch("swan_exact_verdict", swan_exact_verdict_kernel, dim3(static_cast<unsigned>(ceil_div(count, kThreads))), dim3(kThreads), 0, stream, c.st, mats,
           b0, count);
    launch("swan_apply_exact", swan_apply_exact_kernel<T>, grid, dim3(kThreads), 0, stream, mats, b0, c.st, rule, a.write, a.scalars.at,
           a.scalars.slot);
  }
  if (a.stats)
    launch("swan_statistics", swan_statistics_kernel, dim3(1), dim3(1), 0, stream, a.stats, c.st, B, a.exact, a.exact ? 0.0f : a.ns_tolerance,
           a.scalars.at);
}

#define MULTINORM_INSTANTIATE(T, G)                                                                                                  \
  template void swan_chunk<T, G>(const SwanItem*, int64_t, const SwanParams&, LtGemm&, void*, SwanExactGroup* const*, const DeviceLoop&, \
                                 const Upload&, cudaStream_t);
MULTINORM_INSTANTIATE(float, float)
MULTINORM_INSTANTIATE(bf16, bf16)
MULTINORM_INSTANTIATE(bf16, float)
#undef MULTINORM_INSTANTIATE

}  // namespace multinorm::cuda
