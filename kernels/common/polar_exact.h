// SWAN's exact whitening, FP64 end to end on the host (LAPACK): the Gram matrix (dsyrk), its
// eigendecomposition (dsyevd) and U = Z X (dgemm), so singular directions down to ~1e-7 of the
// largest are whitened exactly. Used by the CPU backend and, for its exact path and Newton-Schulz
// fallback, by the CUDA backend (one copy of X to the host and of U back: not the hot path).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "multinorm/error.h"

extern "C" {
void dsyevd_(const char* jobz, const char* uplo, const int* n, double* a, const int* lda, double* w, double* work, const int* lwork, int* iwork,
             const int* liwork, int* info);
void dsyrk_(const char* uplo, const char* trans, const int* n, const int* k, const double* alpha, const double* a, const int* lda,
            const double* beta, double* c, const int* ldc);
void dgemm_(const char* ta, const char* tb, const int* m, const int* n, const int* k, const double* alpha, const double* a, const int* lda,
            const double* b, const int* ldb, const double* beta, double* c, const int* ldc);
}

namespace multinorm {

// Writes U = polar(X) (orthonormal rows when m <= n, columns when m > n) into Ud, row-major [m,n].
// X[m,n] row-major is, for column-major BLAS, M = X^T [n,m] (ld n). Caller buffers, k = min(m, n):
// M [m n], A [k k + k] (Gram matrix, then eigenvectors; eigenvalues after), B [k k], Z [k k].
// Eigenvalues below k * 1e-14 of the largest (FP64 rounding noise of the Gram matrix is ~k * 1.1e-16
// of it) are null directions: no update there.
inline void polar_exact_fp64(double* Ud, const float* X, int64_t m, int64_t n, double* M, double* A, double* B, double* Z) {
  const bool wide = m <= n;
  const int64_t k = wide ? m : n;
  double* lambda = A + k * k;
  for (int64_t i = 0; i < m * n; ++i) M[i] = X[i];
  const int ki = static_cast<int>(k), mi = static_cast<int>(m), ni = static_cast<int>(n);
  const double one = 1.0, zero = 0.0;
  // wide: A = X X^T = M^T M [m,m];  tall: A = X^T X = M M^T [n,n]. Upper triangle, column-major.
  if (wide) dsyrk_("U", "T", &ki, &ni, &one, M, &ni, &zero, A, &ki);
  else dsyrk_("U", "N", &ki, &mi, &one, M, &ni, &zero, A, &ki);
  int info = 0, lwork = -1, liwork = -1, iwork_query = 0;
  double work_query = 0;
  dsyevd_("V", "U", &ki, A, &ki, lambda, &work_query, &lwork, &iwork_query, &liwork, &info);
  lwork = static_cast<int>(work_query);
  liwork = iwork_query;
  std::vector<double> work(lwork);  // LAPACK's workspace: the exact path is not the hot path
  std::vector<int> iwork(liwork);
  dsyevd_("V", "U", &ki, A, &ki, lambda, work.data(), &lwork, iwork.data(), &liwork, &info);
  if (info != 0) throw Error("swan: dsyevd failed (info " + std::to_string(info) + ") on a " + std::to_string(k) + "^2 Gram matrix");
  // A holds the eigenvectors as columns: A[j * k + i] = Q(i, j). Z = Q diag(s) Q^T (symmetric).
  double top = 0;
  for (int64_t j = 0; j < k; ++j) top = std::max(top, lambda[j]);
  const double floor = 1e-14 * static_cast<double>(k) * top;
  for (int64_t j = 0; j < k; ++j) {
    const double s = lambda[j] > floor ? 1.0 / std::sqrt(lambda[j]) : 0.0;
    for (int64_t i = 0; i < k; ++i) B[j * k + i] = A[j * k + i] * s;
  }
  dgemm_("N", "T", &ki, &ki, &ki, &one, B, &ki, A, &ki, &zero, Z, &ki);
  // wide: U = Z X, i.e. U^T = M Z [n,m];  tall: U = X Z, i.e. U^T = Z M [n,m]. U^T column-major is
  // U row-major.
  if (wide) dgemm_("N", "N", &ni, &mi, &mi, &one, M, &ni, Z, &mi, &zero, Ud, &ni);
  else dgemm_("N", "N", &ni, &mi, &ni, &one, Z, &ni, M, &ni, &zero, Ud, &ni);
}

}  // namespace multinorm
