// Casts and reductions: dtype conversion, in-place scaling, and the FP64 sum of squares behind
// global-norm clipping. All memory-bound grid-stride loops.
//   convert<D,S>:  reads n*sizeof(S), writes n*sizeof(D) bytes, 0 FLOPs
//   scale<T>:      reads and writes n*sizeof(T) bytes, n FLOPs
//   sum_squares<T>: reads n*sizeof(T) bytes, 2n FLOPs (FP64 accumulation); a fixed grid of
//                   kSumSquaresBlocks blocks and a one-block final sum in fixed order: the same bits
//                   on every run and every GPU
//   sum_squares_many<T>: the same per tensor for a list, in two launches whatever its length (the
//                   partials grid is kSumSquaresBlocks x tensors, the final one block per tensor)
//   update_statistics: one thread adds the tensors' sums in order (8 bytes each) and finishes the
//                   loss from its totals: the norm, clip factor, loss and skip flag written to the
//                   update's scalars
//   clip_gradients<T>: reads the factor; when it is not 1, reads and writes n*sizeof(T) bytes
//   copy_rows:     rows x cols elements between row strides (a GEMM operand to or from its staged
//                  copy with 128-byte rows: cuda_scratch::gemm_staging), zeros in the destination's
//                  padding: reads rows*cols and writes rows*dst_ld elements, 0 FLOPs
//   add_rows:      dst += src over rows x cols FP32 elements between row strides (an accumulating
//                  GEMM's staged output added back: cuda_scratch::gemm_adds_back): reads 2 rows*cols
//                  and writes rows*cols floats, rows*cols FLOPs
// convert, scale and clip take runs of 8 elements a thread (16-byte packs of BF16, two of FP32) where
// the arrays are 16-byte aligned, the last n mod 8 one by one: the same bits either way.
#include <algorithm>

#include "../common/optim_math.h"
#include "device_utils.cuh"
#include "kernels.h"

namespace multinorm::cuda {

namespace {

constexpr int kRun = 8;  // elements a thread takes at once on the packed path

template <class D, class S, int P>
__device__ __forceinline__ void convert_run(D* dst, const S* src, int64_t i) {
  float v[P];
  load_values<S, P>(src, i, v);
  D out[P];
#pragma unroll
  for (int k = 0; k < P; ++k) out[k] = from_float<D>(v[k]);
  store_packs<D, P>(dst, i, out);
}
template <class T, int P>
__device__ __forceinline__ void scale_run(T* x, int64_t i, float factor) {
  float v[P];
  load_values<T, P>(x, i, v);
  T out[P];
#pragma unroll
  for (int k = 0; k < P; ++k) out[k] = from_float<T>(v[k] * factor);
  store_packs<T, P>(x, i, out);
}

template <class D, class S>
__global__ void convert_kernel(D* dst, const S* src, int64_t n, bool packed) {
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x, stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tail = packed ? n / kRun * kRun : 0;
  for (int64_t k = t; k < tail / kRun; k += stride) convert_run<D, S, kRun>(dst, src, k * kRun);
  for (int64_t i = tail + t; i < n; i += stride) convert_run<D, S, 1>(dst, src, i);
}

// x *= factor over n elements (scale, and clip_gradients once it has read its factor).
template <class T>
__device__ void scale_elements(T* x, int64_t n, float factor, bool packed) {
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x, stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tail = packed ? n / kRun * kRun : 0;
  for (int64_t k = t; k < tail / kRun; k += stride) scale_run<T, kRun>(x, k * kRun, factor);
  for (int64_t i = tail + t; i < n; i += stride) scale_run<T, 1>(x, i, factor);
}

template <class T>
__global__ void scale_kernel(T* x, int64_t n, float factor, bool packed) {
  scale_elements(x, n, factor, packed);
}

// dst[r, c] = src[r, c] for c < cols and 0 for cols <= c < dst_ld, rows dst_ld and src_ld elements apart;
// W is the element's bits.
template <class W>
__global__ void copy_rows_kernel(W* dst, int64_t dst_ld, const W* src, int64_t src_ld, int64_t rows, int64_t cols, bool packed) {
  // A thread takes 16 bytes of a destination row: one 16-byte store into 128-byte rows (the staged
  // copy; one element at a time back into rows off 16 bytes). Element-wise loads from a row off 16
  // bytes still coalesce across the warp. (The first form, an element a thread, ran at 3.5x its
  // memory time on an H100, 2026-11-27.)
  constexpr int P = Pack<W>::kSize;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const W* s = src + r * src_ld;
    W* d = dst + r * dst_ld;
    for (int64_t c0 = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) * P; c0 < dst_ld; c0 += int64_t(gridDim.x) * blockDim.x * P) {
      W v[P];
#pragma unroll
      for (int k = 0; k < P; ++k) v[k] = c0 + k < cols ? s[c0 + k] : W(0);  // the padding: zeros (cuda_scratch::gemm_extents)
      store_row_values<W, P>(d, c0, dst_ld - c0, packed, v);
    }
  }
}

// dst[r, c] += src[r, c] for c < cols, rows dst_ld and src_ld floats apart: a thread 4 columns of a
// row (src's 128-byte rows as one 16-byte load where dst's rows allow it too, else float by float).
__global__ void add_rows_kernel(float* dst, int64_t dst_ld, const float* src, int64_t src_ld, int64_t rows, int64_t cols) {
  constexpr int P = 4;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const float* s = src + r * src_ld;
    float* d = dst + r * dst_ld;
    for (int64_t c0 = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) * P; c0 < cols; c0 += int64_t(gridDim.x) * blockDim.x * P) {
#pragma unroll
      for (int k = 0; k < P; ++k)
        if (c0 + k < cols) d[c0 + k] += s[c0 + k];
    }
  }
}

constexpr int kReduceThreads = 256;

// This thread's share of x[0, n)'s sum of squares in FP64, block `block` of `blocks`: 16-byte packs (8
// values) where x is 16-byte aligned, then the last n mod 8 values one a thread; otherwise a value a
// thread at a time. One function for one tensor and for many: the same bits. (A value a thread ran at
// 2.3x its memory time on an H100, 2026-11-27: 2.26 ms for llama_1b's gradients.)
template <class T>
__device__ double sum_squares_share(const T* x, int64_t n, int64_t block, int64_t blocks) {
  const int64_t first = block * blockDim.x + threadIdx.x, stride = blocks * blockDim.x;
  double s = 0.0;
  int64_t done = 0;
  if (aligned16(x)) {
    done = n / 8 * 8;
    for (int64_t p = first; 8 * p < done; p += stride) {
      float v[8];
      load_values<T, 8>(x, 8 * p, v);
#pragma unroll
      for (int k = 0; k < 8; ++k) s += double(v[k]) * double(v[k]);
    }
  }
  for (int64_t i = done + first; i < n; i += stride) {
    const double v = to_float(x[i]);
    s += v * v;
  }
  return s;
}

// Whether block `block`'s share is empty (a small tensor under the fixed grid): its partial is an exact
// zero, written without the block's reduction (a GPU's idle blocks, and the emulation's, return at once).
template <class T>
__device__ bool sum_squares_share_empty(const T* x, int64_t n, int64_t block) {
  const int64_t first = block * blockDim.x, done = aligned16(x) ? n / 8 * 8 : 0;
  return 8 * first >= done && done + first >= n;
}

template <class T>
__global__ void sum_squares_partial_kernel(double* partials, const T* x, int64_t n) {
  if (sum_squares_share_empty(x, n, blockIdx.x)) {
    if (threadIdx.x == 0) partials[blockIdx.x] = 0.0;
    return;
  }
  double s = sum_squares_share(x, n, blockIdx.x, gridDim.x);
  __shared__ double scratch[32];
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

__global__ void sum_partials_kernel(double* result, const double* partials, int count) {
  double s = 0.0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) s += partials[i];
  __shared__ double scratch[32];
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) *result = s;
}

// Block (b, t): tensor t's partial b, as sum_squares_partial_kernel computes it for that tensor alone.
template <class T>
__global__ void sum_squares_many_partial_kernel(double* partials, const SumSquaresItem* items) {
  const SumSquaresItem it = items[blockIdx.y];
  if (sum_squares_share_empty(static_cast<const T*>(it.x), it.n, blockIdx.x)) {
    if (threadIdx.x == 0) partials[int64_t(blockIdx.y) * gridDim.x + blockIdx.x] = 0.0;
    return;
  }
  double s = sum_squares_share(static_cast<const T*>(it.x), it.n, blockIdx.x, gridDim.x);
  __shared__ double scratch[32];
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) partials[int64_t(blockIdx.y) * gridDim.x + blockIdx.x] = s;
}

// Block t: tensor t's partials summed as sum_partials_kernel sums them.
__global__ void sum_squares_many_final_kernel(double* results, const double* partials, int count) {
  double s = 0.0;
  const double* p = partials + int64_t(blockIdx.x) * count;
  for (int i = threadIdx.x; i < count; i += blockDim.x) s += p[i];
  __shared__ double scratch[32];
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) results[blockIdx.x] = s;
}

__global__ void update_statistics_kernel(UpdateScalars* s, const LossTotals* loss, const double* squares, int64_t count, double grad_clip) {
  if (blockIdx.x == 0 && threadIdx.x == 0) s->stats = optim_math::finish_statistics(squares, count, *loss, *s, grad_clip);
}

template <class T>
__global__ void clip_gradients_kernel(T* x, int64_t n, const UpdateScalars* s, bool packed) {
  const float factor = s->stats.clip_factor;
  if (s->stats.skip || factor == 1.0f) return;
  scale_elements(x, n, factor, packed);
}

unsigned grid_for(int64_t n) { return static_cast<unsigned>(std::min<int64_t>(ceil_div(n, 256), 4096)); }

}  // namespace

template <class D, class S>
void convert(D* dst, const S* src, int64_t n, cudaStream_t stream) {
  if (n > 0) launch("convert", convert_kernel<D, S>, dim3(grid_for(n)), dim3(256), 0, stream, dst, src, n, aligned16(dst) && aligned16(src));
}
void copy_rows(void* dst, int64_t dst_ld, const void* src, int64_t src_ld, int64_t rows, int64_t cols, int element_bytes, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  const int64_t per_pack = 16 / element_bytes;
  const dim3 grid(ceil_div(ceil_div(dst_ld, per_pack), 256), static_cast<unsigned>(std::min<int64_t>(rows, 65535)));
  const bool packed = aligned16(dst) && (dst_ld * element_bytes) % 16 == 0;
  if (element_bytes == 2)
    launch("copy_rows", copy_rows_kernel<uint16_t>, grid, dim3(256), 0, stream, static_cast<uint16_t*>(dst), dst_ld,
           static_cast<const uint16_t*>(src), src_ld, rows, cols, packed);
  else
    launch("copy_rows", copy_rows_kernel<uint32_t>, grid, dim3(256), 0, stream, static_cast<uint32_t*>(dst), dst_ld,
           static_cast<const uint32_t*>(src), src_ld, rows, cols, packed);
}
void add_rows(float* dst, int64_t dst_ld, const float* src, int64_t src_ld, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  const dim3 grid(ceil_div(ceil_div(cols, 4), 256), static_cast<unsigned>(std::min<int64_t>(rows, 65535)));
  launch("add_rows", add_rows_kernel, grid, dim3(256), 0, stream, dst, dst_ld, src, src_ld, rows, cols);
}
template <class T>
void scale(T* x, int64_t n, float factor, cudaStream_t stream) {
  if (n > 0) launch("scale", scale_kernel<T>, dim3(grid_for(n)), dim3(256), 0, stream, x, n, factor, aligned16(x));
}
template <class T>
void sum_squares(double* result, double* partials, const T* x, int64_t n, cudaStream_t stream) {
  launch("sum_squares_partial", sum_squares_partial_kernel<T>, dim3(kSumSquaresBlocks), dim3(kReduceThreads), 0, stream, partials, x, n);
  launch("sum_squares_final", sum_partials_kernel, dim3(1), dim3(kReduceThreads), 0, stream, result, partials, kSumSquaresBlocks);
}

template <class T>
void sum_squares_many(double* results, double* partials, const SumSquaresItem* items, int64_t count, cudaStream_t stream) {
  if (count == 0) return;
  launch("sum_squares_many_partial", sum_squares_many_partial_kernel<T>, dim3(kSumSquaresBlocks, static_cast<unsigned>(count)),
         dim3(kReduceThreads), 0, stream, partials, items);
  launch("sum_squares_many_final", sum_squares_many_final_kernel, dim3(static_cast<unsigned>(count)), dim3(kReduceThreads), 0, stream, results,
         partials, kSumSquaresBlocks);
}
void update_statistics(UpdateScalars* s, const LossTotals* loss, const double* squares, int64_t count, double grad_clip, cudaStream_t stream) {
  launch("update_statistics", update_statistics_kernel, dim3(1), dim3(32), 0, stream, s, loss, squares, count, grad_clip);
}
template <class T>
void clip_gradients(T* x, int64_t n, const UpdateScalars* s, cudaStream_t stream) {
  if (n > 0) launch("clip_gradients", clip_gradients_kernel<T>, dim3(grid_for(n)), dim3(256), 0, stream, x, n, s, aligned16(x));
}

template void convert<float, float>(float*, const float*, int64_t, cudaStream_t);
template void convert<float, bf16>(float*, const bf16*, int64_t, cudaStream_t);
template void convert<bf16, float>(bf16*, const float*, int64_t, cudaStream_t);
template void convert<bf16, bf16>(bf16*, const bf16*, int64_t, cudaStream_t);
template void scale<float>(float*, int64_t, float, cudaStream_t);
template void scale<bf16>(bf16*, int64_t, float, cudaStream_t);
template void sum_squares<float>(double*, double*, const float*, int64_t, cudaStream_t);
template void sum_squares<bf16>(double*, double*, const bf16*, int64_t, cudaStream_t);
template void sum_squares_many<float>(double*, double*, const SumSquaresItem*, int64_t, cudaStream_t);
template void sum_squares_many<bf16>(double*, double*, const SumSquaresItem*, int64_t, cudaStream_t);
template void clip_gradients<float>(float*, int64_t, const UpdateScalars*, cudaStream_t);
template void clip_gradients<bf16>(bf16*, int64_t, const UpdateScalars*, cudaStream_t);

}  // namespace multinorm::cuda
