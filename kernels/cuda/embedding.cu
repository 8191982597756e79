// Token embedding.
//   forward:  out[i, :] = wte[tokens[i], :]          one block per row, 16-byte packs
//             bytes: 4 BT (tokens) + 2 * BT * C * sizeof(T); 0 FLOPs
//   backward: dwte[t, :] += sum over positions i with tokens[i] = t of dout[i, :]
//             deterministic without float atomics: the backend sorts positions into per-token
//             buckets on the host (llm.c's scheme); one thread per (bucket, channel) sums its bucket
//             in position order in FP32 and adds once. bytes: BT * C * sizeof(T) read +
//             2 * U * C * sizeof(G) (U distinct tokens); BT * C FLOPs
#include "device_utils.cuh"
#include "kernels.h"

namespace multinorm::cuda {

namespace {

constexpr int kThreads = 128;

template <class T>
__global__ void embedding_forward_kernel(T* out, const int32_t* tokens, const T* wte, int64_t C) {
  const int64_t i = blockIdx.x;
  const T* src = wte + int64_t(tokens[i]) * C;
  T* dst = out + i * C;
  if (packable<T>(src, C) && packable<T>(dst, C)) {
    const Pack<T>* s = reinterpret_cast<const Pack<T>*>(src);
    Pack<T>* d = reinterpret_cast<Pack<T>*>(dst);
    for (int64_t p = threadIdx.x; p < C / Pack<T>::kSize; p += blockDim.x) d[p] = s[p];
  } else {
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) dst[c] = src[c];
  }
}

template <class T, class G>
__global__ void embedding_backward_kernel(G* dwte, const T* dout, const int32_t* positions, const int32_t* bucket_tokens,
                                          const int32_t* bucket_starts, int64_t C) {
  const int64_t bucket = blockIdx.x;
  const int64_t c = int64_t(blockIdx.y) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float s = 0.0f;
  for (int32_t p = bucket_starts[bucket]; p < bucket_starts[bucket + 1]; ++p) s += to_float(dout[int64_t(positions[p]) * C + c]);
  G* row = dwte + int64_t(bucket_tokens[bucket]) * C;
  row[c] = from_float<G>(to_float(row[c]) + s);
}

}  // namespace

template <class T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte, int64_t BT, int64_t C, cudaStream_t stream) {
  if (BT > 0) launch("embedding_forward", embedding_forward_kernel<T>, dim3(static_cast<unsigned>(BT)), dim3(kThreads), 0, stream, out, tokens, wte, C);
}

template <class T, class G>
void embedding_backward(G* dwte, const T* dout, const int32_t* positions, const int32_t* bucket_tokens, const int32_t* bucket_starts,
                        int64_t num_buckets, int64_t C, cudaStream_t stream) {
  if (num_buckets == 0) return;
  launch("embedding_backward", embedding_backward_kernel<T, G>, dim3(static_cast<unsigned>(num_buckets), ceil_div(C, kThreads)), dim3(kThreads), 0,
         stream, dwte, dout, positions, bucket_tokens, bucket_starts, C);
}

template void embedding_forward<float>(float*, const int32_t*, const float*, int64_t, int64_t, cudaStream_t);
template void embedding_forward<bf16>(bf16*, const int32_t*, const bf16*, int64_t, int64_t, cudaStream_t);
template void embedding_backward<float, float>(float*, const float*, const int32_t*, const int32_t*, const int32_t*, int64_t, int64_t, cudaStream_t);
template void embedding_backward<bf16, bf16>(bf16*, const bf16*, const int32_t*, const int32_t*, const int32_t*, int64_t, int64_t, cudaStream_t);
template void embedding_backward<bf16, float>(float*, const bf16*, const int32_t*, const int32_t*, const int32_t*, int64_t, int64_t, cudaStream_t);

}  // namespace multinorm::cuda
