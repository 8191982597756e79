// Token embedding.
//   forward:  out[i, :] = wte[tokens[i], :]          one block per row, 16-byte packs
//             bytes: 4 BT (tokens) + 2 * BT * C * sizeof(T); 0 FLOPs
//   backward: dwte[t, :] += sum over positions i with tokens[i] = t of dout[i, :]
//             deterministic without float atomics and without the host: the keys (token << 32 |
//             position) are sorted on the device (a bitonic sort: keys are unique, so the order is
//             token, then position); then the sorted keys are taken in chunks of 32: a thread per
//             (chunk, channel) sums each run piece of its chunk in position order in FP32, adds a
//             run that starts and ends in the chunk to dwte at once, and leaves the pieces of a run
//             that crosses the chunk's edges (a head: the run began earlier; a tail: it goes on) in
//             scratch; a second kernel adds each crossing run's tail and the following chunks'
//             heads in chunk order and adds the sum once. A run of R positions costs a thread at
//             most 32 + R / 32 steps, so padding or a frequent token no longer leaves one thread
//             summing its whole run while the others wait.
//             sort: n = BT rounded up to a power of two, 8 n bytes, log2(n)(log2(n)+1)/2 stages, of
//             which those with strides >= 2048 are one global launch each (llama_60m's 16384 tokens:
//             6 global stage launches + 4 shared-memory ones); sum: BT * C * sizeof(T) read +
//             2 * U * C * sizeof(G) (U distinct tokens) + the crossing pieces (at most 2 BT C 4 / 32
//             written and read); BT * C FLOPs
#include "../common/op_math.h"
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

constexpr int kSortChunk = static_cast<int>(cuda_scratch::kEmbeddingSortChunk);  // keys a block sorts in shared memory
constexpr int64_t kSumChunk = cuda_scratch::kEmbeddingRunChunk;  // sorted keys a backward block sums (a chunk)
static_assert(kSumChunk == op_math::kEmbeddingSumChunk, "the CPU backend cuts the runs at the same places");

__device__ __forceinline__ int32_t key_token(uint64_t k) { return static_cast<int32_t>(k >> 32); }
__device__ __forceinline__ int64_t key_position(uint64_t k) { return static_cast<int64_t>(k & 0xffffffffu); }

// keys[i] = token << 32 | i below BT, all ones (after every real key) up to n.
__global__ void embedding_keys_kernel(uint64_t* keys, const int32_t* tokens, int64_t BT, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    keys[i] = i < BT ? (uint64_t(uint32_t(tokens[i])) << 32 | uint64_t(i)) : ~uint64_t(0);
}

// One bitonic compare-exchange of elements i and i ^ j (i the lower), ascending where i & k is 0.
__device__ __forceinline__ void compare_exchange(uint64_t& a, uint64_t& b, bool ascending) {
  if ((a > b) == ascending) {
    const uint64_t t = a;
    a = b, b = t;
  }
}

// Stage (k, j) over the whole array, j >= chunk: one thread per pair.
__global__ void bitonic_global_kernel(uint64_t* keys, int64_t n, int64_t k, int64_t j) {
  const int64_t pair = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;  // n / 2 pairs
  if (pair >= n / 2) return;
  const int64_t i = (pair / j) * 2 * j + pair % j;  // the lower element of the pair
  compare_exchange(keys[i], keys[i + j], (i & k) == 0);
}

// The stages that stay within a chunk of `chunk` keys, in shared memory: every (k, j) with
// k <= chunk (k_outer = 0: sorts each chunk, alternating directions), or the strides j < chunk of
// one outer k.
__global__ void bitonic_local_kernel(uint64_t* keys, int chunk, int64_t k_outer) {
  MN_DYNAMIC_SHARED(uint64_t, s);
  const int64_t base = int64_t(blockIdx.x) * chunk;
  for (int t = threadIdx.x; t < chunk; t += blockDim.x) s[t] = keys[base + t];
  __syncthreads();
  auto stage = [&](int64_t k, int j) {
    for (int p = threadIdx.x; p < chunk / 2; p += blockDim.x) {
      const int i = (p / j) * 2 * j + p % j;
      compare_exchange(s[i], s[i + j], ((base + i) & k) == 0);
    }
    __syncthreads();
  };
  if (k_outer == 0) {
    for (int k = 2; k <= chunk; k <<= 1)
      for (int j = k / 2; j > 0; j >>= 1) stage(k, j);
  } else {
    for (int j = chunk / 2; j > 0; j >>= 1) stage(k_outer, j);
  }
  for (int t = threadIdx.x; t < chunk; t += blockDim.x) keys[base + t] = s[t];
}

// Sorted keys of chunk q = blockIdx.x ([32 q, 32 q + 32)), channel c = blockIdx.y * 128 + threadIdx.x:
// every run piece of the chunk summed in position order; a run inside the chunk is added to dwte,
// a piece of a run that crosses the chunk's start goes to head[q], of one that crosses its end (and
// began inside it) to tail[q].
template <class T, class G>
__global__ void embedding_backward_kernel(G* dwte, float* head, float* tail, const T* dout, const uint64_t* keys, int64_t BT, int64_t C) {
  const int64_t c = int64_t(blockIdx.y) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int64_t q = blockIdx.x, first = q * kSumChunk, end = first + kSumChunk < BT ? first + kSumChunk : BT;
  for (int64_t s = first; s < end;) {
    const int32_t token = key_token(keys[s]);
    float sum = 0.0f;
    int64_t r = s;
    for (; r < end && key_token(keys[r]) == token; ++r) sum += to_float(dout[key_position(keys[r]) * C + c]);
    const bool began_before = s == first && s > 0 && key_token(keys[s - 1]) == token;
    const bool goes_on = r == end && r < BT && key_token(keys[r]) == token;
    if (began_before) {
      head[q * C + c] = sum;  // also when it goes on: the run's middle chunks are heads
    } else if (goes_on) {
      tail[q * C + c] = sum;
    } else {
      G* row = dwte + int64_t(token) * C;
      row[c] = from_float<G>(to_float(row[c]) + sum);
    }
    s = r;
  }
}

// A run that began in chunk q and goes on: its tail[q] plus the heads of the chunks it reaches, in
// chunk order, added to its token's row once.
template <class G>
__global__ void embedding_backward_runs_kernel(G* dwte, const float* head, const float* tail, const uint64_t* keys, int64_t BT, int64_t C) {
  const int64_t c = int64_t(blockIdx.y) * blockDim.x + threadIdx.x;
  const int64_t q = blockIdx.x, end = (q + 1) * kSumChunk;
  if (c >= C || end >= BT) return;
  const int32_t token = key_token(keys[end - 1]);
  if (key_token(keys[end]) != token) return;  // no run crosses this chunk's end
  const int64_t first = q * kSumChunk;
  if (q > 0 && key_token(keys[first - 1]) == token && key_token(keys[first]) == token) return;  // all of the chunk continues an earlier run
  float sum = tail[q * C + c];
  for (int64_t p = q + 1; p * kSumChunk < BT && key_token(keys[p * kSumChunk]) == token; ++p) sum += head[p * C + c];
  G* row = dwte + int64_t(token) * C;
  row[c] = from_float<G>(to_float(row[c]) + sum);
}

}  // namespace

template <class T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte, int64_t BT, int64_t C, cudaStream_t stream) {
  if (BT > 0) launch("embedding_forward", embedding_forward_kernel<T>, dim3(static_cast<unsigned>(BT)), dim3(kThreads), 0, stream, out, tokens, wte, C);
}

template <class T, class G>
void embedding_backward(G* dwte, const T* dout, const int32_t* tokens, int64_t BT, int64_t C, uint64_t* keys, cudaStream_t stream) {
  if (BT == 0) return;
  const int64_t n = cuda_scratch::embedding_sort_length(BT);
  const int chunk = static_cast<int>(n < kSortChunk ? n : kSortChunk);
  const unsigned chunks = static_cast<unsigned>(n / chunk);
  launch("embedding_keys", embedding_keys_kernel, dim3(ceil_div(n, 256)), dim3(256), 0, stream, keys, tokens, BT, n);
  const size_t smem = sizeof(uint64_t) * chunk;
  const unsigned threads = static_cast<unsigned>(chunk / 2 < 1024 ? chunk / 2 : 1024);
  launch("embedding_sort_local", bitonic_local_kernel, dim3(chunks), dim3(threads), smem, stream, keys, chunk, int64_t{0});
  for (int64_t k = 2 * chunk; k <= n; k <<= 1) {
    for (int64_t j = k / 2; j >= chunk; j >>= 1)
      launch("embedding_sort_global", bitonic_global_kernel, dim3(ceil_div(n / 2, 256)), dim3(256), 0, stream, keys, n, k, j);
    launch("embedding_sort_local", bitonic_local_kernel, dim3(chunks), dim3(threads), smem, stream, keys, chunk, k);
  }
  float* head = reinterpret_cast<float*>(keys + n);
  float* tail = head + cuda_scratch::embedding_run_chunks(BT) * C;
  const dim3 grid(static_cast<unsigned>(cuda_scratch::embedding_run_chunks(BT)), ceil_div(C, kThreads));
  launch("embedding_backward", embedding_backward_kernel<T, G>, grid, dim3(kThreads), 0, stream, dwte, head, tail, dout, keys, BT, C);
  launch("embedding_backward_runs", embedding_backward_runs_kernel<G>, grid, dim3(kThreads), 0, stream, dwte, head, tail, keys, BT, C);
}

template void embedding_forward<float>(float*, const int32_t*, const float*, int64_t, int64_t, cudaStream_t);
template void embedding_forward<bf16>(bf16*, const int32_t*, const bf16*, int64_t, int64_t, cudaStream_t);
template void embedding_backward<float, float>(float*, const float*, const int32_t*, int64_t, int64_t, uint64_t*, cudaStream_t);
template void embedding_backward<bf16, bf16>(bf16*, const bf16*, const int32_t*, int64_t, int64_t, uint64_t*, cudaStream_t);
template void embedding_backward<bf16, float>(float*, const bf16*, const int32_t*, int64_t, int64_t, uint64_t*, cudaStream_t);

}  // namespace multinorm::cuda
