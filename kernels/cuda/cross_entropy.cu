// Softmax cross-entropy over rows of FP32 logits[N, V] fused with its gradient and the loss mask:
// one block per row; pass 1 keeps an online (max, sum of exp) per thread, merged by warp shuffles and
// then across warps; pass 2 writes dlogits = (softmax - onehot) * grad_scale directly (probabilities
// are never stored; dlogits may alias logits: each element is read then written by one thread).
// bytes: N V 4 read twice (the second pass mostly from L2 for V = 32000 rows of 128 KB) + N V
// sizeof(T) written; ~5 N V FLOPs. The FP32 path and the unfused default of the loss head use it.
//
// The fused loss head (BF16, linear_cross_entropy): the FP32 logits of R rows are never stored
// whole. The backend computes them a vocabulary chunk at a time, [R, Vc] with Vc ~ 2000 (8 MB at
// R = 1024: it stays in L2 between the GEMM that writes it and the kernel that reads it, and the
// next chunk's GEMM overwrites the same lines), and for each chunk
//   cross_entropy_chunk: a block of 8 warps per row, 16-byte loads, two passes over the row (the
//     second from L1): the chunk's max m_c, then e = exp(x - m_c) as BF16 into dlogits (backward)
//     and their sum s_c, and the target's logit when it falls in the chunk; bytes 4 R Vc read
//     (L2) + 2 R Vc written, one exponential a logit;
// then once per R rows
//   cross_entropy_finish: a block per row merges the chunks' (m_c, s_c) in chunk order into lse,
//     writes the loss, and scales dlogits in place by exp(m_c - lse) grad_scale, 16 bytes at a time
//     (the target's entry from its exact FP32 logit, as p - 1 must not inherit e's rounding);
//     bytes 4 R V (2 read, 2 written).
// Against the unfused 4 + 8 + 2 bytes per logit (GEMM write, two reads, dlogits write): 2 + 4 to
// DRAM when the tile stays in L2, 6 + 4 when it does not. accumulate_loss: one block reads the N
// losses and the mask (5 N bytes) and adds their FP64 sum, count and mean to the update's totals.
#include "../common/optim_math.h"
#include "device_utils.cuh"
#include "kernels.h"

namespace multinorm::cuda {

namespace {

constexpr int kThreads = 512;

// Merge two (max, sum of exp(x - max)) pairs.
__device__ __forceinline__ void merge(float& m, float& s, float m2, float s2) {
  const float mn = fmaxf(m, m2);
  if (mn == -INFINITY) return;  // both empty
  s = s * __expf(m - mn) + s2 * __expf(m2 - mn);
  m = mn;
}

template <class T>
__global__ void cross_entropy_kernel(float* losses, T* dlogits, const float* logits, const int32_t* targets, const uint8_t* mask, int64_t V,
                                     float grad_scale) {
  __shared__ float warp_m[32], warp_s[32];
  const int64_t row = blockIdx.x;
  const float* x = logits + row * V;
  T* d = dlogits ? dlogits + row * V : nullptr;
  if (mask && !mask[row]) {  // the whole block takes this branch: no barrier is skipped by some threads only
    if (threadIdx.x == 0) losses[row] = 0.0f;
    if (d)
      for (int64_t v = threadIdx.x; v < V; v += blockDim.x) d[v] = from_float<T>(0.0f);
    return;
  }
  float m = -INFINITY, s = 0.0f;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    const float xv = x[v];
    if (xv > m) {
      s = s * __expf(m - xv) + 1.0f;
      m = xv;
    } else if (xv != -INFINITY) {  // a -inf logit adds nothing (and -inf - -inf would be NaN)
      s += __expf(xv - m);
    }
  }
  for (int o = 16; o > 0; o >>= 1) merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_m[warp] = m, warp_s[warp] = s;
  __syncthreads();
  m = lane < int(blockDim.x / 32) ? warp_m[lane] : -INFINITY;
  s = lane < int(blockDim.x / 32) ? warp_s[lane] : 0.0f;
  for (int o = 16; o > 0; o >>= 1) merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
  // The two lanes of a butterfly pair merge in opposite orders, which FMA contraction may round
  // differently: every thread takes lane 0's (m, s), so one lse serves the whole row.
  m = __shfl_sync(0xffffffffu, m, 0);
  s = __shfl_sync(0xffffffffu, s, 0);
  const float lse = m + logf(s);
  const int32_t t = targets[row];
  const float xt = x[t];
  __syncthreads();  // every thread has read x[t] before the row is overwritten (aliasing)
  if (threadIdx.x == 0) losses[row] = lse - xt;
  if (d) {
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
      const float p = __expf(x[v] - lse);
      d[v] = from_float<T>((v == t ? p - 1.0f : p) * grad_scale);
    }
  }
}

// Threads of cross_entropy_chunk's block, one row: a warp per row (its first form) left each lane a
// serial chain of ~60 exponentials over Vc ~ 2000 with 8 warps an SM in flight, and it ran at 12x its
// memory time on an H100 (2026-11-27: 2.43 ms for 128 launches at llama_1b's 32 x 256).
constexpr int kChunkThreads = 256;

// exp(x - m) for a logit x of a row whose max is m: 0 for a -inf logit (in a row of -inf, m - m would
// be NaN), NaN for a NaN one, so a NaN logit still reaches the loss.
__device__ __forceinline__ float shifted_exp(float x, float m) { return x == -INFINITY ? 0.0f : __expf(x - m); }

// The row's max over the block, the same in every thread (a max is exact in any order); `part` holds
// the warps' maxima.
__device__ __forceinline__ float block_max(float m, float* part) {
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = m;
  __syncthreads();
  m = -INFINITY;
  for (int w = 0; w < kChunkThreads / 32; ++w) m = fmaxf(m, part[w]);
  return m;
}

// Grid R, block kChunkThreads: a block per row of the FP32 tile [R, Vc] holding logits columns v0 ..
// v0 + Vc - 1, in two passes over the row (the second from L1): its max m, then e = exp(x - m),
// written as BF16 into dlogits (backward) and summed, a thread's values in column order, the lanes by
// butterfly, the warps in order by thread 0. One exponential a logit and none in the reductions,
// where an online (max, sum) took one a logit, two a merge, and read the row twice all the same.
__global__ void cross_entropy_chunk_kernel(ChunkStats* stats, float* target_logit, bf16* dlogits, const float* tile, const int32_t* targets,
                                           const uint8_t* mask, int64_t Vc, int64_t v0, int64_t V, int64_t chunk, int64_t chunks) {
  __shared__ float warp_maxes[kChunkThreads / 32], warp_sums[kChunkThreads / 32];
  const int64_t row = blockIdx.x;
  if (mask && !mask[row]) return;  // the whole block; the finish kernel zeroes masked rows
  const float* x = tile + row * Vc;
  bf16* d = dlogits ? dlogits + row * V + v0 : nullptr;
  float m = -INFINITY;
  if (Vc % 4 == 0) {  // the tile's rows start on 16 bytes
#pragma unroll 4
    for (int64_t p = threadIdx.x; p < Vc / 4; p += kChunkThreads) {
      float v[4];
      load_values<float, 4>(x, 4 * p, v);
      m = fmaxf(fmaxf(m, fmaxf(v[0], v[1])), fmaxf(v[2], v[3]));
    }
  } else {
    for (int64_t v = threadIdx.x; v < Vc; v += kChunkThreads) m = fmaxf(m, x[v]);
  }
  m = block_max(m, warp_maxes);
  // The sum's order depends on Vc alone, so a loss is the same bits with and without dlogits.
  float s = 0.0f;
  if (Vc % 8 == 0) {  // 8 values a step: two 16-byte loads, and one 16-byte store where dlogits allows
    const bool packed_d = d && packable<bf16>(d, 8);
#pragma unroll 2
    for (int64_t p = threadIdx.x; p < Vc / 8; p += kChunkThreads) {
      float v[8];
      load_values<float, 8>(x, 8 * p, v);
      bf16 o[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const float e = shifted_exp(v[k], m);
        s += e, o[k] = from_float<bf16>(e);
      }
      if (packed_d) store_packs<bf16, 8>(d, 8 * p, o);
      else if (d)
#pragma unroll
        for (int k = 0; k < 8; ++k) d[8 * p + k] = o[k];
    }
  } else {
    for (int64_t v = threadIdx.x; v < Vc; v += kChunkThreads) {
      const float e = shifted_exp(x[v], m);
      s += e;
      if (d) d[v] = from_float<bf16>(e);
    }
  }
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = s;
  __syncthreads();
  if (threadIdx.x != 0) return;
  s = 0.0f;
  for (int w = 0; w < kChunkThreads / 32; ++w) s += warp_sums[w];  // warp order: deterministic
  stats[row * chunks + chunk] = ChunkStats{m, s};
  const int64_t t = targets[row];
  if (t >= v0 && t < v0 + Vc) target_logit[row] = x[t - v0];
}

// A block per row: lse from the chunks' (m_c, s_c) in chunk order (every thread the same bits), the
// loss, and dlogits = e exp(m_c - lse) grad_scale in place, the target's (p_t - 1) grad_scale.
__global__ void cross_entropy_finish_kernel(float* losses, bf16* dlogits, const ChunkStats* stats, const float* target_logit, const int32_t* targets,
                                            const uint8_t* mask, int64_t V, int64_t Vc, int64_t chunks, float grad_scale) {
  const int64_t row = blockIdx.x;
  bf16* d = dlogits ? dlogits + row * V : nullptr;
  if (mask && !mask[row]) {  // the whole block
    if (threadIdx.x == 0) losses[row] = 0.0f;
    if (d)
      for (int64_t v = threadIdx.x; v < V; v += blockDim.x) d[v] = from_float<bf16>(0.0f);
    return;
  }
  const ChunkStats* st = stats + row * chunks;
  float m = -INFINITY, s = 0.0f;
  for (int64_t c = 0; c < chunks; ++c) merge(m, s, st[c].max, st[c].sum);
  const float lse = m + logf(s), xt = target_logit[row];
  const int64_t t = targets[row];
  if (threadIdx.x == 0) losses[row] = lse - xt;
  if (!d) return;
  const float target_grad = (__expf(xt - lse) - 1.0f) * grad_scale;
  if (Vc % 8 == 0 && packable<bf16>(d, V)) {  // a pack never straddles two chunks
    for (int64_t p = threadIdx.x; p < V / 8; p += blockDim.x) {
      const float f = __expf(st[(8 * p) / Vc].max - lse) * grad_scale;
      float e[8];
      load_values<bf16, 8>(d, 8 * p, e);
      bf16 o[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) o[k] = from_float<bf16>(8 * p + k == t ? target_grad : e[k] * f);
      store_packs<bf16, 8>(d, 8 * p, o);
    }
  } else {
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x)
      d[v] = from_float<bf16>(v == t ? target_grad : to_float(d[v]) * (__expf(st[v / Vc].max - lse) * grad_scale));
  }
}

// One block of kLossLanes threads: lane j adds positions j, j + kLossLanes, ... (FP64, in order),
// thread 0 adds the lanes in lane order: optim_math's order, the CPU's bits.
__global__ void accumulate_loss_kernel(LossTotals* totals, const float* losses, const uint8_t* mask, int64_t n) {
  __shared__ double lane_sums[optim_math::kLossLanes];
  __shared__ int64_t lane_counts[optim_math::kLossLanes];
  double s = 0;
  int64_t c = 0;
  for (int64_t i = threadIdx.x; i < n; i += optim_math::kLossLanes)
    if (mask[i]) s += losses[i], ++c;
  lane_sums[threadIdx.x] = s;
  lane_counts[threadIdx.x] = c;
  __syncthreads();
  if (threadIdx.x != 0) return;
  double sum = 0;
  int64_t count = 0;
  for (int j = 0; j < optim_math::kLossLanes; ++j) sum += lane_sums[j], count += lane_counts[j];
  optim_math::add_micro_batch_loss(*totals, sum, count);
}

}  // namespace

void accumulate_loss(LossTotals* totals, const float* losses, const uint8_t* mask, int64_t N, cudaStream_t stream) {
  launch("accumulate_loss", accumulate_loss_kernel, dim3(1), dim3(optim_math::kLossLanes), 0, stream, totals, losses, mask, N);
}

template <class T>
void cross_entropy(float* losses, T* dlogits, const float* logits, const int32_t* targets, const uint8_t* mask, int64_t N, int64_t V,
                   float grad_scale, cudaStream_t stream) {
  if (N > 0)
    launch("cross_entropy", cross_entropy_kernel<T>, dim3(static_cast<unsigned>(N)), dim3(kThreads), 0, stream, losses, dlogits, logits, targets,
           mask, V, grad_scale);
}

void cross_entropy_chunk(ChunkStats* stats, float* target_logit, bf16* dlogits, const float* tile, const int32_t* targets, const uint8_t* mask,
                         int64_t R, int64_t Vc, int64_t v0, int64_t V, int64_t chunk, int64_t chunks, cudaStream_t stream) {
  if (R > 0)
    launch("cross_entropy_chunk", cross_entropy_chunk_kernel, dim3(static_cast<unsigned>(R)), dim3(kChunkThreads), 0, stream, stats, target_logit,
           dlogits, tile, targets, mask, Vc, v0, V, chunk, chunks);
}

void cross_entropy_finish(float* losses, bf16* dlogits, const ChunkStats* stats, const float* target_logit, const int32_t* targets,
                          const uint8_t* mask, int64_t R, int64_t V, int64_t Vc, int64_t chunks, float grad_scale, cudaStream_t stream) {
  if (R > 0)
    launch("cross_entropy_finish", cross_entropy_finish_kernel, dim3(static_cast<unsigned>(R)), dim3(256), 0, stream, losses, dlogits, stats,
           target_logit, targets, mask, V, Vc, chunks, grad_scale);
}

template void cross_entropy<float>(float*, float*, const float*, const int32_t*, const uint8_t*, int64_t, int64_t, float, cudaStream_t);
template void cross_entropy<bf16>(float*, bf16*, const float*, const int32_t*, const uint8_t*, int64_t, int64_t, float, cudaStream_t);

}  // namespace multinorm::cuda
