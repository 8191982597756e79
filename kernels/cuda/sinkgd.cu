// SinkGD on W, G [m, n], fused (the algorithm and its CPU twin: kernels/cpu/sinkgd.cpp):
//   X = diag(u) G diag(v) is never materialised; each of the L iterations is one kernel over G:
//   a block owns a fixed chunk of rows (kChunks chunks: the same reduction tree on every GPU); for each
//   row it block-reduces ||G_i o v||, sets u_i = sqrt(n) / max(norm, eps), and adds u_i^2 G_ij^2 to
//   its column partial in shared memory (thread t owns columns t, t + blockDim, ...: no races, no
//   atomics); a second small kernel sums the partials in chunk order into v_j = sqrt(m) / max(., eps).
//   The last kernel reads G and W once and writes W.
// Bytes: L x (|G| + kChunks n 4 x 2) + |G| + 2 |W|; with BF16 G and W that is 2L + 6 bytes per element
// (L = 5: 16 B/element) against Adam's 12 (BF16 w, g, m, v read; w, m, v written) — and no state.
// The row's second read (for the column partial) hits L1: a BF16 row of 5461 is 11 KB.
#include <cmath>

#include "device_utils.cuh"
#include "kernels.h"
#include "scratch_sizes.h"

namespace multinorm::cuda {

namespace {

constexpr int64_t kChunks = cuda_scratch::kSinkgdChunks;  // row chunks (blocks) of each pass: fixed for determinism
constexpr int kThreads = 256;

int64_t chunks_for(int64_t m) { return std::min<int64_t>(m, kChunks); }

__global__ void fill_kernel(float* x, int64_t n, float value) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) x[i] = value;
}

// One row pass: u from v, and each chunk's column partial of u^2 G^2.
template <class G>
__global__ void sinkgd_rows_kernel(float* u, float* partials, const G* g, const float* v, int64_t m, int64_t n, int64_t rows_per_chunk,
                                   float sqrt_n, float eps) {
  MN_DYNAMIC_SHARED(float, col);
  __shared__ float scratch[32];
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) col[j] = 0.0f;
  const int64_t begin = int64_t(blockIdx.x) * rows_per_chunk;
  const int64_t end = begin + rows_per_chunk < m ? begin + rows_per_chunk : m;
  for (int64_t i = begin; i < end; ++i) {
    const G* gi = g + i * n;
    float r = 0.0f;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const float x = to_float(gi[j]) * v[j];
      r += x * x;
    }
    r = block_sum(r, scratch);
    const float ui = sqrt_n / fmaxf(sqrtf(r), eps);
    if (threadIdx.x == 0) u[i] = ui;
    const float u2 = ui * ui;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const float x = to_float(gi[j]);
      col[j] += u2 * x * x;
    }
  }
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) partials[int64_t(blockIdx.x) * n + j] = col[j];
}

__global__ void sinkgd_cols_kernel(float* v, const float* partials, int64_t chunks, int64_t n, float sqrt_m, float eps) {
  const int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= n) return;
  float s = 0.0f;
  for (int64_t c = 0; c < chunks; ++c) s += partials[c * n + j];  // chunk order: deterministic
  v[j] = sqrt_m / fmaxf(sqrtf(s), eps);
}

template <class T, class G>
__global__ void sinkgd_apply_kernel(T* w, const G* g, const float* u, const float* v, int64_t m, int64_t n, float lr, float keep, WriteBack wb) {
  const int64_t total = m * n;
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < total; k += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = k / n, j = k % n;
    w[k] = store_weight<T>(to_float(w[k]) * keep - lr * u[i] * to_float(g[k]) * v[j], wb, static_cast<uint64_t>(k));
  }
}

}  // namespace

int64_t sinkgd_scratch(int64_t m, int64_t n) { return cuda_scratch::sinkgd_floats(m, n); }

template <class T, class G>
void sinkgd(T* w, const G* g, int64_t m, int64_t n, int iterations, float eps, float lr, float keep, const WriteBack& wb, float* scratch,
            cudaStream_t stream) {
  if (m * n == 0) return;
  if (n * 4 > 48 * 1024)
    throw_launch_error("sinkgd_rows", dim3(), dim3(), n * 4, "a row of " + std::to_string(n) + " columns exceeds the 12,288 of one block's shared column partial");
  float* u = scratch;
  float* v = u + m;
  float* partials = v + n;
  const int64_t chunks = chunks_for(m), rows_per_chunk = (m + chunks - 1) / chunks;
  const int64_t used = (m + rows_per_chunk - 1) / rows_per_chunk;
  const float sqrt_n = std::sqrt(static_cast<float>(n)), sqrt_m = std::sqrt(static_cast<float>(m));
  launch("sinkgd_init", fill_kernel, dim3(ceil_div(n, 256)), dim3(256), 0, stream, v, n, 1.0f);
  for (int it = 0; it < iterations; ++it) {
    launch("sinkgd_rows", sinkgd_rows_kernel<G>, dim3(static_cast<unsigned>(used)), dim3(kThreads), n * sizeof(float), stream, u, partials, g, v,
           m, n, rows_per_chunk, sqrt_n, eps);
    launch("sinkgd_cols", sinkgd_cols_kernel, dim3(ceil_div(n, 256)), dim3(256), 0, stream, v, partials, used, n, sqrt_m, eps);
  }
  if (iterations == 0) launch("sinkgd_init", fill_kernel, dim3(ceil_div(m, 256)), dim3(256), 0, stream, u, m, 1.0f);
  launch("sinkgd_apply", sinkgd_apply_kernel<T, G>, dim3(static_cast<unsigned>(std::min<int64_t>(ceil_div(m * n, 256), 8192))), dim3(256), 0, stream,
         w, g, u, v, m, n, lr, keep, wb);
}

template void sinkgd<float, float>(float*, const float*, int64_t, int64_t, int, float, float, float, const WriteBack&, float*, cudaStream_t);
template void sinkgd<bf16, bf16>(bf16*, const bf16*, int64_t, int64_t, int, float, float, float, const WriteBack&, float*, cudaStream_t);
template void sinkgd<bf16, float>(bf16*, const float*, int64_t, int64_t, int, float, float, float, const WriteBack&, float*, cudaStream_t);

}  // namespace multinorm::cuda
