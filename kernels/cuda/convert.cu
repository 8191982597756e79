// Casts and reductions: dtype conversion, in-place scaling, and the FP64 sum of squares behind
// global-norm clipping. All memory-bound grid-stride loops.
//   convert<D,S>:  reads n*sizeof(S), writes n*sizeof(D) bytes, 0 FLOPs
//   scale<T>:      reads and writes n*sizeof(T) bytes, n FLOPs
//   sum_squares<T>: reads n*sizeof(T) bytes, 2n FLOPs (FP64 accumulation); a fixed grid of
//                   kSumSquaresBlocks blocks and a one-block final sum in fixed order: the same bits
//                   on every run and every GPU
#include "device_utils.cuh"
#include "kernels.h"

namespace multinorm::cuda {

namespace {

template <class D, class S>
__global__ void convert_kernel(D* dst, const S* src, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = from_float<D>(to_float(src[i]));
}

template <class T>
__global__ void scale_kernel(T* x, int64_t n, float factor) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = from_float<T>(to_float(x[i]) * factor);
}

constexpr int kReduceThreads = 256;

template <class T>
__global__ void sum_squares_partial_kernel(double* partials, const T* x, int64_t n) {
  double s = 0.0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const double v = to_float(x[i]);
    s += v * v;
  }
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

unsigned grid_for(int64_t n) { return static_cast<unsigned>(std::min<int64_t>(ceil_div(n, 256), 4096)); }

}  // namespace

template <class D, class S>
void convert(D* dst, const S* src, int64_t n, cudaStream_t stream) {
  if (n > 0) launch("convert", convert_kernel<D, S>, dim3(grid_for(n)), dim3(256), 0, stream, dst, src, n);
}
template <class T>
void scale(T* x, int64_t n, float factor, cudaStream_t stream) {
  if (n > 0) launch("scale", scale_kernel<T>, dim3(grid_for(n)), dim3(256), 0, stream, x, n, factor);
}
template <class T>
void sum_squares(double* result, double* partials, const T* x, int64_t n, cudaStream_t stream) {
  launch("sum_squares_partial", sum_squares_partial_kernel<T>, dim3(kSumSquaresBlocks), dim3(kReduceThreads), 0, stream, partials, x, n);
  launch("sum_squares_final", sum_partials_kernel, dim3(1), dim3(kReduceThreads), 0, stream, result, partials, kSumSquaresBlocks);
}

template void convert<float, float>(float*, const float*, int64_t, cudaStream_t);
template void convert<float, bf16>(float*, const bf16*, int64_t, cudaStream_t);
template void convert<bf16, float>(bf16*, const float*, int64_t, cudaStream_t);
template void convert<bf16, bf16>(bf16*, const bf16*, int64_t, cudaStream_t);
template void scale<float>(float*, int64_t, float, cudaStream_t);
template void scale<bf16>(bf16*, int64_t, float, cudaStream_t);
template void sum_squares<float>(double*, double*, const float*, int64_t, cudaStream_t);
template void sum_squares<bf16>(double*, double*, const bf16*, int64_t, cudaStream_t);

}  // namespace multinorm::cuda
