// SWAN: gradient normalisation then whitening, for W, G of shape [m, n]:
//   X = sqrt(n) G_i / ||G_i||  per row   (or, SWAN paper's GradNorm: (G_i - mean) / std)
//   U = sqrt(n) (X X^T)^(-1/2) X         (= sqrt(n) X (X^T X)^(-1/2) when m > n: the same polar
//                                          factor, computed on the smaller Gram matrix, k = min(m, n))
//   W <- W (1 - lr wd) - lr U
// (A)^(-1/2), A the k x k Gram matrix, comes from the coupled Newton-Schulz iteration in FP32 on the
// backend's GEMMs: Y0 = A / c, Z0 = I, T = (3I - Z Y) / 2, Y <- Y T, Z <- T Z, so Z -> (A / c)^(-1/2).
// The iteration starts from c = 1.25 x a power-iteration estimate of the top eigenvalue.
// Guards: A is regularised by 1e-6 ||A||_F I (FP32 rounding can make a rank-deficient Gram matrix
// slightly indefinite, where the iteration diverges), and a non-finite result falls back to the
// exact path. The exact path diagonalises A in FP64 (LAPACK dsyevd) and inverts the square roots of
// eigenvalues above 1e-10 of the largest (a pseudo-inverse: null directions get no update).
#include <cmath>
#include <cstring>
#include <vector>

#include "cpu_kernels.h"
#include "matmul_onednn.h"
#include "multinorm/error.h"

extern "C" void dsyevd_(const char* jobz, const char* uplo, const int* n, double* a, const int* lda, double* w,
                        double* work, const int* lwork, int* iwork, const int* liwork, int* info);

namespace multinorm::cpu {

namespace {

enum Slot : size_t { kX = 30, kA, kY, kZ, kP, kT, kU, kEig };

Buf f32(float* p) { return {p, DType::F32}; }

double frobenius(const float* a, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(a[i]) * a[i];
  return std::sqrt(s);
}

// out[k,k] = A^(-1/2) exactly (FP64 eigendecomposition).
void inverse_sqrt_exact(float* out, const float* A, int64_t k, Workspace& ws) {
  double* a = reinterpret_cast<double*>(ws.floats(2 * k * k + 2 * k, kEig));
  double* lambda = a + k * k;
  for (int64_t i = 0; i < k * k; ++i) a[i] = A[i];
  const int n = static_cast<int>(k);
  int info = 0, lwork = -1, liwork = -1, iwork_query = 0;
  double work_query = 0;
  dsyevd_("V", "U", &n, a, &n, lambda, &work_query, &lwork, &iwork_query, &liwork, &info);
  lwork = static_cast<int>(work_query);
  liwork = iwork_query;
  std::vector<double> work(lwork);
  std::vector<int> iwork(liwork);
  dsyevd_("V", "U", &n, a, &n, lambda, work.data(), &lwork, iwork.data(), &liwork, &info);
  if (info != 0) throw Error("swan: dsyevd failed (info " + std::to_string(info) + ")");
  // a holds eigenvectors as columns (column-major): a[j * k + i] = Q(i, j).
  double top = 0;
  for (int64_t j = 0; j < k; ++j) top = std::max(top, lambda[j]);
  std::vector<double> s(k);
  for (int64_t j = 0; j < k; ++j) s[j] = lambda[j] > 1e-10 * top ? 1.0 / std::sqrt(lambda[j]) : 0.0;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < k; ++i)
    for (int64_t l = 0; l < k; ++l) {
      double acc = 0;
      for (int64_t j = 0; j < k; ++j) acc += a[j * k + i] * s[j] * a[j * k + l];
      out[i * k + l] = static_cast<float>(acc);
    }
}

// A scale c with the eigenvalues of A / c in (0, 1.6): 1.25 x a power-iteration estimate of the
// largest eigenvalue, capped by ||A||_F (which bounds it). ||A||_F alone can exceed the top
// eigenvalue by sqrt(k), which costs Newton-Schulz several steps on the small eigenvalues.
double spectral_scale(const float* A, int64_t k, Workspace& ws) {
  double* x = reinterpret_cast<double*>(ws.floats(4 * k, kEig));
  double* y = x + k;
  for (int64_t i = 0; i < k; ++i) x[i] = 1.0 / std::sqrt(static_cast<double>(k)) * (1.0 + 0.01 * (i % 7));
  double lambda = 0;
  for (int it = 0; it < 12; ++it) {
    double norm = 0, rq = 0;
    for (int64_t i = 0; i < k; ++i) {
      double s = 0;
      for (int64_t j = 0; j < k; ++j) s += A[i * k + j] * x[j];
      y[i] = s;
      rq += x[i] * s;
      norm += s * s;
    }
    lambda = rq;  // Rayleigh quotient (x has unit norm)
    norm = std::sqrt(norm);
    if (norm == 0) break;
    for (int64_t i = 0; i < k; ++i) x[i] = y[i] / norm;
  }
  const double frob = frobenius(A, k * k);
  return lambda > 0 ? std::min(frob, 1.25 * lambda) : frob;
}

// out[k,k] = A^(-1/2) by Newton-Schulz; false when the result is not finite.
bool inverse_sqrt_newton_schulz(float* out, float* A, int64_t k, const SwanArgs& args, OneDnnMatmul& gemm,
                                Workspace& ws) {
  float* Y = ws.floats(k * k, kY);
  float* P = ws.floats(k * k, kP);
  float* T = ws.floats(k * k, kT);
  const double reg = 1e-6 * frobenius(A, k * k) + args.eps;
  for (int64_t i = 0; i < k; ++i) A[i * k + i] += static_cast<float>(reg);
  const double c = spectral_scale(A, k, ws);
  for (int64_t i = 0; i < k * k; ++i) Y[i] = static_cast<float>(A[i] / c);
  float* Z = out;
  std::memset(Z, 0, k * k * sizeof(float));
  for (int64_t i = 0; i < k; ++i) Z[i * k + i] = 1.0f;
  for (int s = 0; s < args.ns_steps; ++s) {
    gemm.run(f32(P), f32(Z), f32(Y), k, k, k, false, false, false);  // P = Z Y
    double resid = 0;
    for (int64_t i = 0; i < k; ++i)
      for (int64_t j = 0; j < k; ++j) {
        const double r = (i == j ? 1.0 : 0.0) - P[i * k + j];
        resid += r * r;
        T[i * k + j] = static_cast<float>(0.5 * ((i == j ? 3.0 : 0.0) - P[i * k + j]));
      }
    if (args.ns_tolerance > 0 && std::sqrt(resid / k) < args.ns_tolerance) break;
    gemm.run(f32(P), f32(Y), f32(T), k, k, k, false, false, false);  // Y <- Y T
    std::memcpy(Y, P, k * k * sizeof(float));
    gemm.run(f32(P), f32(T), f32(Z), k, k, k, false, false, false);  // Z <- T Z
    std::memcpy(Z, P, k * k * sizeof(float));
  }
  const float scale = static_cast<float>(1.0 / std::sqrt(c));
  bool finite = true;
  for (int64_t i = 0; i < k * k; ++i) {
    Z[i] *= scale;
    finite = finite && std::isfinite(Z[i]);
  }
  return finite;
}

}  // namespace

template <class T>
void swan_update(T* w, const T* g, int64_t m, int64_t n, const SwanArgs& a, OneDnnMatmul& gemm, Workspace& ws) {
  float* X = ws.floats(m * n, kX);
  const float sqrt_n = std::sqrt(static_cast<float>(n));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < m; ++i) {
    const T* gi = g + i * n;
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
  const bool wide = m <= n;  // whiten rows (X X^T) or columns (X^T X)
  const int64_t k = wide ? m : n;
  float* A = ws.floats(k * k, kA);
  float* Zf = ws.floats(k * k, kZ);
  float* U = ws.floats(m * n, kU);
  if (wide) gemm.run(f32(A), f32(X), f32(X), m, m, n, false, true, false);   // A = X X^T
  else gemm.run(f32(A), f32(X), f32(X), n, n, m, true, false, false);        // A = X^T X
  if (a.exact || !inverse_sqrt_newton_schulz(Zf, A, k, a, gemm, ws)) {
    if (!a.exact) {  // A was regularised in place: rebuild it
      if (wide) gemm.run(f32(A), f32(X), f32(X), m, m, n, false, true, false);
      else gemm.run(f32(A), f32(X), f32(X), n, n, m, true, false, false);
    }
    inverse_sqrt_exact(Zf, A, k, ws);
  }
  if (wide) gemm.run(f32(U), f32(Zf), f32(X), m, n, m, false, false, false);  // U = Z X
  else gemm.run(f32(U), f32(X), f32(Zf), m, n, n, false, false, false);       // U = X Z
  const float keep = 1.0f - a.lr * a.decoupled_decay, step = a.lr * sqrt_n;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < m * n; ++i)
    w[i] = write_weight<T>(to_f32(w[i]) * keep - step * U[i], a.write, static_cast<uint64_t>(i));
}

template void swan_update<float>(float*, const float*, int64_t, int64_t, const SwanArgs&, OneDnnMatmul&, Workspace&);
template void swan_update<bf16>(bf16*, const bf16*, int64_t, int64_t, const SwanArgs&, OneDnnMatmul&, Workspace&);

}  // namespace multinorm::cpu
