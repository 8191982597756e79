// SWAN: gradient normalisation then whitening, for W, G of shape [m, n]:
//   X = sqrt(n) G_i / ||G_i||  per row   (or, SWAN paper's GradNorm: (G_i - mean) / std)
//   U = s (X X^T)^(-1/2) X     m <= n    (= s X (X^T X)^(-1/2) when m > n: the same polar factor,
//                                         computed on the smaller Gram matrix, k = min(m, n))
//   s = sqrt(max(m, n)), so ||U||_F = sqrt(m n) for either orientation (the paper's scaling: both
//   normalised projections have Frobenius norm sqrt(mn); the polar factor alone has sqrt(min(m, n)))
//   W <- W (1 - lr wd) - lr U
// (A)^(-1/2), A the k x k Gram matrix, comes from the coupled Newton-Schulz iteration in FP32 on the
// backend's GEMMs: Y0 = A / c, Z0 = I, T = a I - b Z Y, Y <- Y T, Z <- T Z, so Z -> (A / c)^(-1/2),
// scaled: (a, b) from a lower bound of the spectrum (optim_math::ns_step; (3/2, 1/2) is the plain
// iteration). c = min(||A||_F, the largest absolute row sum of A) bounds A's largest eigenvalue, so the
// spectrum of A / c is in (0, 1] and no eigenvalue can leave the iteration's basin.
// Guards: A is regularised by 1e-6 ||A||_F I (FP32 rounding can make a rank-deficient Gram matrix
// slightly indefinite, where the iteration diverges), and a non-finite result falls back to the
// exact path. The residual ||I - Z Y||_F / sqrt(k) after the last step is returned, so the caller
// can report iterations that did not converge (they are never accepted silently).
// The exact path is FP64 end to end: the Gram matrix (dsyrk), its eigendecomposition (dsyevd) and
// U = Z X (dgemm), so singular directions down to ~1e-7 of the largest are whitened exactly (an FP32
// Gram matrix holds them as rounding noise below ~3e-4). Eigenvalues below k * 1e-14 of the largest
// (FP64 rounding noise of the Gram matrix is ~k * 1.1e-16 of it) are null directions: no update.
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "../common/optim_math.h"
#include "../common/polar_exact.h"
#include "cpu_kernels.h"
#include "matmul_onednn.h"
#include "multinorm/error.h"

namespace multinorm::cpu {

namespace {

enum Slot : size_t { kX = 30, kA, kY, kZ, kP, kT, kU, kEig, kXd, kAd, kBd, kUd };

Buf f32(float* p) { return {p, DType::F32}; }
double* doubles(Workspace& ws, int64_t n, size_t slot) { return reinterpret_cast<double*>(ws.floats(2 * n, slot)); }

double frobenius(const float* a, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(a[i]) * a[i];
  return std::sqrt(s);
}

// The exact path (kernels/common/polar_exact.h) with its FP64 buffers from the workspace.
void polar_exact(double* Ud, const float* X, int64_t m, int64_t n, Workspace& ws) {
  const int64_t k = std::min(m, n);
  polar_exact_fp64(Ud, X, m, n, doubles(ws, m * n, kXd), doubles(ws, k * k + k, kAd), doubles(ws, k * k, kBd), doubles(ws, k * k, kEig));
}

// The largest absolute row sum of the symmetric A (FP64): an upper bound of its largest eigenvalue,
// tight where A is near diagonal (where ||A||_F exceeds it by up to sqrt(k)).
double max_abs_row_sum(const float* A, int64_t k) {
  double most = 0;
  for (int64_t i = 0; i < k; ++i) {
    double s = 0;
    for (int64_t j = 0; j < k; ++j) s += std::fabs(static_cast<double>(A[i * k + j]));
    most = std::max(most, s);
  }
  return most;
}

// ||I - P||_F / sqrt(k), and (optionally) T = step.identity I - step.product P.
double residual(const float* P, int64_t k, float* T, const optim_math::NsStep& step) {
  double r2 = 0;
  for (int64_t i = 0; i < k; ++i)
    for (int64_t j = 0; j < k; ++j) {
      const double p = P[i * k + j], eye = i == j ? 1.0 : 0.0;
      r2 += (eye - p) * (eye - p);
      if (T) T[i * k + j] = static_cast<float>(step.identity * eye - step.product * p);
    }
  return std::sqrt(r2 / static_cast<double>(k));
}

// out[k,k] = A^(-1/2) by Newton-Schulz. Returns the residual ||I - Z Y||_F / sqrt(k) of the final
// iterate (NaN when the result is not finite); *steps: the iterations applied.
double inverse_sqrt_newton_schulz(float* out, float* A, int64_t k, const SwanArgs& args, OneDnnMatmul& gemm,
                                  Workspace& ws, int* steps) {
  float* Y = ws.floats(k * k, kY);
  float* P = ws.floats(k * k, kP);
  float* T = ws.floats(k * k, kT);
  const double reg = 1e-6 * frobenius(A, k * k) + args.eps;
  for (int64_t i = 0; i < k; ++i) A[i * k + i] += static_cast<float>(reg);
  const double c = std::min(frobenius(A, k * k), max_abs_row_sum(A, k));
  double lower = std::sqrt(static_cast<double>(static_cast<float>(reg)) / c);  // A's eigenvalues are at least the regularisation
  for (int64_t i = 0; i < k * k; ++i) Y[i] = static_cast<float>(A[i] / c);
  float* Z = out;
  std::memset(Z, 0, k * k * sizeof(float));
  for (int64_t i = 0; i < k; ++i) Z[i * k + i] = 1.0f;
  double resid = -1;  // of the current (Y, Z); -1 until measured
  *steps = args.ns_steps;
  for (int s = 0; s < args.ns_steps; ++s) {
    gemm.run(f32(P), f32(Z), f32(Y), k, k, k, false, false, false);  // P = Z Y
    const optim_math::NsStep step = optim_math::ns_step(lower);
    resid = residual(P, k, T, step);
    if (args.ns_tolerance > 0 && resid < args.ns_tolerance) {
      *steps = s;
      break;
    }
    gemm.run(f32(P), f32(Y), f32(T), k, k, k, false, false, false);  // Y <- Y T
    std::memcpy(Y, P, k * k * sizeof(float));
    gemm.run(f32(P), f32(T), f32(Z), k, k, k, false, false, false);  // Z <- T Z
    std::memcpy(Z, P, k * k * sizeof(float));
    lower = step.next_lower;
    resid = -1;
  }
  if (resid < 0) {  // every step ran: measure the final iterate
    gemm.run(f32(P), f32(Z), f32(Y), k, k, k, false, false, false);
    resid = residual(P, k, nullptr, {});
  }
  const float scale = static_cast<float>(1.0 / std::sqrt(c));
  bool finite = std::isfinite(resid);
  for (int64_t i = 0; i < k * k; ++i) {
    Z[i] *= scale;
    finite = finite && std::isfinite(Z[i]);
  }
  return finite ? resid : std::numeric_limits<double>::quiet_NaN();
}

}  // namespace

template <class T, class G>
SwanReport swan_update(T* w, const G* g, int64_t m, int64_t n, const SwanArgs& a, OneDnnMatmul& gemm, Workspace& ws) {
  float* X = ws.floats(m * n, kX);
  const float sqrt_n = std::sqrt(static_cast<float>(n));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < m; ++i) {
    const G* gi = g + i * n;
    float* xi = X + i * n;
    if (a.standardize) {
      double mean = 0, var = 0;
      for (int64_t j = 0; j < n; ++j) mean += to_f32(gi[j]);
      mean /= n;
      for (int64_t j = 0; j < n; ++j) var += (to_f32(gi[j]) - mean) * (to_f32(gi[j]) - mean);
      const float inv = 1.0f / std::max(static_cast<float>(std::sqrt(var / n)), a.eps);
      for (int64_t j = 0; j < n; ++j) xi[j] = (to_f32(gi[j]) - static_cast<float>(mean)) * inv;
    } else {
      float ss = 0;
      for (int64_t j = 0; j < n; ++j) ss += to_f32(gi[j]) * to_f32(gi[j]);
      const float inv = sqrt_n / std::max(std::sqrt(ss), a.eps);
      for (int64_t j = 0; j < n; ++j) xi[j] = to_f32(gi[j]) * inv;
    }
  }
  const float keep = 1.0f - a.lr * a.decoupled_decay;
  const float step = a.lr * std::sqrt(static_cast<float>(std::max(m, n)));  // ||U||_F = sqrt(mn)
  SwanReport report;
  const bool wide = m <= n;  // whiten rows (X X^T) or columns (X^T X)
  const int64_t k = wide ? m : n;
  if (!a.exact) {
    float* A = ws.floats(k * k, kA);
    float* Zf = ws.floats(k * k, kZ);
    float* U = ws.floats(m * n, kU);
    if (wide) gemm.run(f32(A), f32(X), f32(X), m, m, n, false, true, false);  // A = X X^T
    else gemm.run(f32(A), f32(X), f32(X), n, n, m, true, false, false);       // A = X^T X
    report.residual = inverse_sqrt_newton_schulz(Zf, A, k, a, gemm, ws, &report.steps);
    if (std::isfinite(report.residual)) {
      if (wide) gemm.run(f32(U), f32(Zf), f32(X), m, n, m, false, false, false);  // U = Z X
      else gemm.run(f32(U), f32(X), f32(Zf), m, n, n, false, false, false);       // U = X Z
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < m * n; ++i)
        w[i] = write_weight<T>(to_f32(w[i]) * keep - step * U[i], a.write, static_cast<uint64_t>(i));
      return report;
    }
    report.fell_back = true;  // Newton-Schulz diverged: the exact path below
  }
  double* Ud = doubles(ws, m * n, kUd);
  polar_exact(Ud, X, m, n, ws);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < m * n; ++i)
    w[i] = write_weight<T>(static_cast<float>(to_f32(w[i]) * keep - static_cast<double>(step) * Ud[i]), a.write,
                           static_cast<uint64_t>(i));
  return report;
}

#define MULTINORM_INSTANTIATE(T, G) \
  template SwanReport swan_update<T, G>(T*, const G*, int64_t, int64_t, const SwanArgs&, OneDnnMatmul&, Workspace&);
MULTINORM_INSTANTIATE(float, float)
MULTINORM_INSTANTIATE(bf16, bf16)
MULTINORM_INSTANTIATE(bf16, float)
#undef MULTINORM_INSTANTIATE

}  // namespace multinorm::cpu
