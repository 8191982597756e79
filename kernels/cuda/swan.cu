// SWAN on W, G [m, n] (the algorithm, its guards and its CPU twin: kernels/cpu/swan.cpp):
//   X = row-normalised G (l2 to sqrt(n), or standardised), FP32      one kernel, a block per row
//   A = X X^T (m <= n) or X^T X (m > n), k = min(m, n)                 cuBLASLt, FP32
//   A += (1e-6 ||A||_F + eps) I; c = min(||A||_F, 1.25 lambda_max)     12 power-iteration steps in FP64
//   Newton-Schulz: Y0 = A / c, Z0 = I; P = Z Y, T = (3I - P) / 2, Y <- Y T, Z <- T Z   cuBLASLt, FP32
//   U = sqrt(max(m, n)) Z X (or X Z) / sqrt(c);  W <- W (1 - lr wd) - lr U
// No allocation per step (one scratch buffer, ping-pong matrices); the residual ||I - Z Y||_F / sqrt(k)
// is reduced on the device into a small probe (residual, non-finite count, the update's skip flag).
// The op decides on the host, from that probe, in its own waits (CudaQueue::read): with
// ns_tolerance > 0 it reads the probe every kCheckEvery steps and stops once the residual is below
// the tolerance; at the end it reads it once more for the statistics and the non-finite fallback; a
// skipped update (non-finite gradient norm, a loss spike) stops at the first read, applying nothing.
// Why on the host: a read costs a stream synchronisation (~10-30 us on a GPU), one Newton-Schulz step
// three k^3 GEMMs (k = 2048 at llama_1b: ~2.6 ms in FP32 on an A100), so stopping when converged
// saves more than running the remaining steps with a device-side flag would. The update is therefore
// not captured in a graph (the rule says so: TensorRule::capturable).
// The exact path (and the fallback when Newton-Schulz diverges) is the CPU's FP64 LAPACK routine
// (kernels/common/polar_exact.h) on the host: X goes to the host and U comes back. cuSOLVER's syevd
// would keep it on the device, but the exact path is a reference and a safety net, not the hot path.
// Cost: 3 GEMMs of k^3 per step (2 k^3 FLOPs each) + the Gram matrix and U (2 m n k each).
#include <cmath>
#include <vector>

#include "../common/polar_exact.h"
#include "check.h"
#include "cuda_queue.h"
#include "device_utils.cuh"
#include "gemm.h"
#include "kernels.h"
#include "multinorm/cuda_scratch.h"

namespace multinorm::cuda {

// What the host reads of a tensor's Newton-Schulz: written on the device, read in one copy (outside the
// anonymous namespace: swan() below, which is not in it, captures a pointer to it).
struct SwanProbe {
  double residual;
  unsigned nonfinite;  // non-finite entries of U
  unsigned skip;       // the update's skip flag (UpdateStatistics::skip), 0 without update scalars
};

namespace {

constexpr int kThreads = 256;
constexpr int kPowerSteps = cuda_scratch::kSwanPowerSteps;
constexpr int kCheckEvery = 2;
constexpr int kReduceBlocks = cuda_scratch::kSwanReduceBlocks;

template <class G>
__global__ void normalize_rows_kernel(float* X, const G* g, int64_t n, bool standardize, float sqrt_n, float eps) {
  __shared__ double dscratch[32];
  __shared__ float fscratch[32];
  const int64_t i = blockIdx.x;
  const G* gi = g + i * n;
  float* xi = X + i * n;
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
    const float inv = sqrt_n / fmaxf(sqrtf(block_sum(ss, fscratch)), eps);
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) xi[j] = to_float(gi[j]) * inv;
  }
}

// A[i,i] += 1e-6 ||A||_F + eps (frob2 = ||A||_F^2 on the device)
__global__ void regularize_kernel(float* A, int64_t k, const double* frob2, float eps) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < k) A[i * k + i] += float(1e-6 * sqrt(*frob2) + eps);
}

__global__ void power_init_kernel(double* x, int64_t k) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < k) x[i] = 1.0 / sqrt(double(k)) * (1.0 + 0.01 * double(i % 7));
}

// y = A x, a warp per row, FP64
__global__ void power_matvec_kernel(double* y, const float* A, const double* x, int64_t k) {
  const int64_t i = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (i >= k) return;
  const int lane = threadIdx.x % 32;
  double s = 0;
  for (int64_t j = lane; j < k; j += 32) s += double(A[i * k + j]) * x[j];
  s = warp_sum(s);
  if (lane == 0) y[i] = s;
}

// lambda = x . y (the Rayleigh quotient: x has unit norm), x = y / ||y||; one block
__global__ void power_normalize_kernel(double* x, const double* y, double* lambda, int64_t k) {
  __shared__ double scratch[32];
  double rq = 0, nn = 0;
  for (int64_t i = threadIdx.x; i < k; i += blockDim.x) rq += x[i] * y[i], nn += y[i] * y[i];
  rq = block_sum(rq, scratch);
  nn = block_sum(nn, scratch);
  __syncthreads();  // every x[i] is read before it is overwritten
  if (threadIdx.x == 0) *lambda = rq;
  const double norm = sqrt(nn);
  if (norm == 0) return;
  for (int64_t i = threadIdx.x; i < k; i += blockDim.x) x[i] = y[i] / norm;
}

// c = lambda > 0 ? min(||A||_F, 1.25 lambda) : ||A||_F; Y = A / c; Z = I
__global__ void ns_init_kernel(float* Y, float* Z, const float* A, int64_t k, const double* frob2, const double* lambda, double* c) {
  const double frob = sqrt(*frob2), l = *lambda;
  const double cc = l > 0 ? fmin(frob, 1.25 * l) : frob;
  const int64_t total = k * k;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    Y[e] = float(A[e] / cc);
    Z[e] = e / k == e % k ? 1.0f : 0.0f;
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) *c = cc;
}

// partial sums of ||I - P||^2 per block, and T = (3I - P) / 2 when T is given
__global__ void residual_partial_kernel(double* partials, float* T, const float* P, int64_t k) {
  __shared__ double scratch[32];
  double r2 = 0;
  const int64_t total = k * k;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const double p = P[e], eye = e / k == e % k ? 1.0 : 0.0;
    r2 += (eye - p) * (eye - p);
    if (T) T[e] = float(0.5 * (3.0 * eye - p));
  }
  r2 = block_sum(r2, scratch);
  if (threadIdx.x == 0) partials[blockIdx.x] = r2;
}
__global__ void residual_final_kernel(double* resid, const double* partials, int count, int64_t k) {
  __shared__ double scratch[32];
  double s = 0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) s += partials[i];
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) *resid = sqrt(s / double(k));
}

// U scaled by step / sqrt(c) written into W, step = lr sqrt(max(m, n)) (the lr, keep and write step
// from the update's scalars when given: take_update_scalars)
template <class T>
__global__ void swan_apply_kernel(T* w, const float* U, int64_t total, const double* c, RuleScalars r, float sqrt_max, WriteBack wb,
                                  const UpdateScalars* s, int slot) {
  if (!take_update_scalars(s, slot, r, wb)) return;
  const float keep = r.keep, step = r.lr * sqrt_max;
  const float scale = step * float(1.0 / sqrt(*c));
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x)
    w[e] = store_weight<T>(to_float(w[e]) * keep - scale * U[e], wb, static_cast<uint64_t>(e));
}

template <class T>
__global__ void swan_apply_exact_kernel(T* w, const double* Ud, int64_t total, RuleScalars r, float sqrt_max, WriteBack wb,
                                        const UpdateScalars* s, int slot) {
  if (!take_update_scalars(s, slot, r, wb)) return;
  const float keep = r.keep;
  const double step = r.lr * sqrt_max;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x)
    w[e] = store_weight<T>(float(to_float(w[e]) * keep - step * Ud[e]), wb, static_cast<uint64_t>(e));
}

__global__ void probe_init_kernel(SwanProbe* p, const UpdateScalars* s) {
  p->nonfinite = 0;
  p->skip = s ? s->stats.skip : 0u;
}

// Non-finite entries of U -> counts[0] (deterministic: an integer count)
__global__ void count_nonfinite_kernel(unsigned* count, const float* U, int64_t total) {
  unsigned local = 0;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) local += !isfinite(U[e]);
  if (local) atomicAdd(count, local);  // an integer: order-independent
}

unsigned grid_for(int64_t n) { return static_cast<unsigned>(std::min<int64_t>(ceil_div(n, kThreads), 4096)); }

}  // namespace

int64_t swan_scratch_bytes(int64_t m, int64_t n) { return cuda_scratch::swan_bytes(m, n); }

template <class T, class G>
SwanResult swan(T* w, const G* g, int64_t m, int64_t n, const SwanParams& a, LtGemm& gemm, void* scratch, CudaQueue& q) {
  SwanResult result;
  const bool wide = m <= n;
  const int64_t k = wide ? m : n;
  float* X = static_cast<float*>(scratch);
  float* U = X + m * n;
  float* A = U + m * n;
  float* Y = A + k * k;
  float* Z = Y + k * k;
  float* P = Z + k * k;
  float* Tm = P + k * k;
  float* spare = Tm + k * k;  // ping-pong partner of Y and Z
  double* x = reinterpret_cast<double*>(spare + k * k);
  double* y = x + k;
  double* partials = y + k;
  double* ss_partials = partials + kReduceBlocks;
  double* frob2 = ss_partials + kSumSquaresBlocks;
  double* lambda = frob2 + 1;
  double* c = lambda + 1;
  SwanProbe* probe = reinterpret_cast<SwanProbe*>(c + 1);
  double* resid = &probe->residual;
  unsigned* nonfinite = &probe->nonfinite;
  cudaStream_t stream = q.issue();
  const RuleScalars rule = optim_math::rule_scalars(a.lr, a.decoupled_decay);
  auto skipped = [] {
    SwanResult r;
    r.skipped = true;
    return r;
  };
  const float sqrt_max = std::sqrt(static_cast<float>(std::max(m, n)));  // step = lr sqrt(max(m, n)): ||U||_F = sqrt(mn)

  launch("swan_probe_init", probe_init_kernel, dim3(1), dim3(1), 0, stream, probe, a.scalars.at);
  launch("swan_normalize_rows", normalize_rows_kernel<G>, dim3(static_cast<unsigned>(m)), dim3(kThreads), 0, stream, X, g, n, a.standardize,
         std::sqrt(static_cast<float>(n)), a.eps);
  auto read_probe = [&] {
    SwanProbe p{};
    q.read(&p, probe, sizeof(SwanProbe), "swan (its residual)");
    stream = q.issue();
    return p;
  };
  auto residual = [&](float* T_out) {
    launch("swan_residual", residual_partial_kernel, dim3(kReduceBlocks), dim3(kThreads), 0, stream, partials, T_out, P, k);
    launch("swan_residual_final", residual_final_kernel, dim3(1), dim3(kThreads), 0, stream, resid, partials, kReduceBlocks, k);
  };
  if (!a.exact) {
    if (wide) gemm.run(A, CUDA_R_32F, X, X, CUDA_R_32F, m, m, n, false, true, false, stream);  // A = X X^T
    else gemm.run(A, CUDA_R_32F, X, X, CUDA_R_32F, n, n, m, true, false, false, stream);       // A = X^T X
    sum_squares(frob2, ss_partials, A, k * k, stream);
    launch("swan_regularize", regularize_kernel, dim3(ceil_div(k, kThreads)), dim3(kThreads), 0, stream, A, k, frob2, a.eps);
    sum_squares(frob2, ss_partials, A, k * k, stream);  // ||A||_F after regularisation, as on the CPU
    launch("swan_power_init", power_init_kernel, dim3(ceil_div(k, kThreads)), dim3(kThreads), 0, stream, x, k);
    for (int it = 0; it < kPowerSteps; ++it) {
      launch("swan_power_matvec", power_matvec_kernel, dim3(ceil_div(k, kThreads / 32)), dim3(kThreads), 0, stream, y, A, x, k);
      launch("swan_power_normalize", power_normalize_kernel, dim3(1), dim3(kThreads), 0, stream, x, y, lambda, k);
    }
    launch("swan_ns_init", ns_init_kernel, dim3(grid_for(k * k)), dim3(kThreads), 0, stream, Y, Z, A, k, frob2, lambda, c);
    bool measured = false;  // the residual of the current (Y, Z) is in resid
    for (int s = 0; s < a.ns_steps; ++s) {
      gemm.run(P, CUDA_R_32F, Z, Y, CUDA_R_32F, k, k, k, false, false, false, stream);  // P = Z Y
      residual(Tm);
      measured = true;
      if (a.ns_tolerance > 0 && (s + 1) % kCheckEvery == 0) {
        const SwanProbe p = read_probe();
        if (p.skip) return skipped();
        if (p.residual < a.ns_tolerance) break;
      }
      gemm.run(spare, CUDA_R_32F, Y, Tm, CUDA_R_32F, k, k, k, false, false, false, stream);  // Y <- Y T
      std::swap(Y, spare);
      gemm.run(spare, CUDA_R_32F, Tm, Z, CUDA_R_32F, k, k, k, false, false, false, stream);  // Z <- T Z
      std::swap(Z, spare);
      measured = false;
    }
    if (!measured) {  // every step ran: measure the final iterate
      gemm.run(P, CUDA_R_32F, Z, Y, CUDA_R_32F, k, k, k, false, false, false, stream);
      residual(nullptr);
    }
    if (wide) gemm.run(U, CUDA_R_32F, Z, X, CUDA_R_32F, m, n, m, false, false, false, stream);  // U = Z X
    else gemm.run(U, CUDA_R_32F, X, Z, CUDA_R_32F, m, n, n, false, false, false, stream);       // U = X Z
    launch("swan_count_nonfinite", count_nonfinite_kernel, dim3(grid_for(m * n)), dim3(kThreads), 0, stream, nonfinite, U, m * n);
    const SwanProbe p = read_probe();
    if (p.skip) return skipped();
    result.residual = p.residual;
    if (std::isfinite(result.residual) && p.nonfinite == 0) {
      launch("swan_apply", swan_apply_kernel<T>, dim3(grid_for(m * n)), dim3(kThreads), 0, stream, w, U, m * n, c, rule, sqrt_max, a.write,
             a.scalars.at, a.scalars.slot);
      return result;
    }
    result.residual = std::nan("");
    result.fell_back = true;  // Newton-Schulz diverged: the exact path below
  }
  // Exact path: X to the host, FP64 polar factor there, U back (as doubles, for the FP64 step).
  std::vector<float> hx(static_cast<size_t>(m * n));
  q.read(hx.data(), X, m * n * 4, "swan exact path (X to the host)");
  if (a.exact) {  // the Newton-Schulz path read the skip flag already
    const SwanProbe p = read_probe();
    if (p.skip) return skipped();
  }
  std::vector<double> Ud(m * n), M(m * n), Ah(k * k + k), B(k * k), Zh(k * k);
  polar_exact_fp64(Ud.data(), hx.data(), m, n, M.data(), Ah.data(), B.data(), Zh.data());
  double* dU = reinterpret_cast<double*>(X);  // X and U [m n floats each] are contiguous: m n doubles
  MN_CUDA_CHECK(cudaMemcpyAsync(dU, Ud.data(), m * n * 8, cudaMemcpyHostToDevice, q.issue()), "swan exact path (U to the device)");
  launch("swan_apply_exact", swan_apply_exact_kernel<T>, dim3(grid_for(m * n)), dim3(kThreads), 0, q.issue(), w, dU, m * n, rule, sqrt_max, a.write,
         a.scalars.at, a.scalars.slot);
  q.wait_all("swan exact path");  // Ud (host) must outlive the copy
  return result;
}

template SwanResult swan<float, float>(float*, const float*, int64_t, int64_t, const SwanParams&, LtGemm&, void*, CudaQueue&);
template SwanResult swan<bf16, bf16>(bf16*, const bf16*, int64_t, int64_t, const SwanParams&, LtGemm&, void*, CudaQueue&);
template SwanResult swan<bf16, float>(bf16*, const float*, int64_t, int64_t, const SwanParams&, LtGemm&, void*, CudaQueue&);

}  // namespace multinorm::cuda
