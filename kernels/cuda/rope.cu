// Rotary position embedding in place on the q and k sections of qkv[B*T, 3*H*D], rotate-half pairs
// (i, i + D/2) (formula: kernels/common/op_math.h); the backward pass is the inverse rotation.
// A thread rotates P = 16 / sizeof(T) consecutive pairs (i .. i + P - 1 with their partners at
// + D/2: two 16-byte loads and stores of x, 2 P floats of the cos/sin table in 16-byte loads), with
// one 64-bit division per P pairs to find its row; heads whose half width is not a multiple of P
// (or unaligned buffers) take a thread per pair. bytes: 2 B T 2C sizeof(T) (q and k read and
// written) + the cos/sin table (L2-resident); 6 FLOPs per pair. The same bits either way.
#include "../common/op_math.h"
#include "device_utils.cuh"
#include "kernels.h"

namespace multinorm::cuda {

namespace {

template <class T>
__global__ void rope_kernel(T* qkv, const float* cos_sin, int64_t pairs, int64_t T_, int64_t H, int64_t D, float sign) {
  const int64_t half = D / 2;
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < pairs; k += int64_t(gridDim.x) * blockDim.x) {
    // k = ((bt * 2 + section) * H + h) * half + i: consecutive threads take consecutive i (coalesced)
    const int64_t i = k % half, h = k / half % H, section = k / (half * H) % 2, bt = k / (half * H * 2);
    const int64_t pos = bt % T_;
    T* x = qkv + bt * 3 * H * D + section * H * D + h * D;
    const float c = cos_sin[(pos * half + i) * 2], s = sign * cos_sin[(pos * half + i) * 2 + 1];
    float a, b;
    op_math::rope_rotate(to_float(x[i]), to_float(x[i + half]), c, s, a, b);
    x[i] = from_float<T>(a);
    x[i + half] = from_float<T>(b);
  }
}

// Work item k = bt * (2 H half / P) + r: row bt, and within the row r = (section * H + h) * (half / P) + j.
template <class T>
__global__ void rope_packed_kernel(T* qkv, const float* cos_sin, int64_t items, int64_t T_, int H, int D, float sign) {
  constexpr int P = Pack<T>::kSize;
  const int half = D / 2, groups = half / P, per_row = 2 * H * groups;
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < items; k += int64_t(gridDim.x) * blockDim.x) {
    const int64_t bt = k / per_row;
    const int r = static_cast<int>(k - bt * per_row), head = r / groups, i = (r - head * groups) * P;  // head: section * H + h
    T* x = qkv + bt * 3 * int64_t(H) * D + int64_t(head) * D;
    const float* cs = cos_sin + ((bt % T_) * half + i) * 2;
    Pack<T> a = *reinterpret_cast<const Pack<T>*>(x + i), b = *reinterpret_cast<const Pack<T>*>(x + i + half);
    float c[2 * P];
    load_values<float, 2 * P>(cs, 0, c);
#pragma unroll
    for (int p = 0; p < P; ++p) {
      float ao, bo;
      op_math::rope_rotate(to_float(a.v[p]), to_float(b.v[p]), c[2 * p], sign * c[2 * p + 1], ao, bo);
      a.v[p] = from_float<T>(ao), b.v[p] = from_float<T>(bo);
    }
    *reinterpret_cast<Pack<T>*>(x + i) = a;
    *reinterpret_cast<Pack<T>*>(x + i + half) = b;
  }
}

}  // namespace

template <class T>
void rope(T* qkv, const float* cos_sin, int64_t B, int64_t T_, int64_t H, int64_t D, bool inverse, cudaStream_t stream) {
  const int64_t pairs = B * T_ * 2 * H * (D / 2);
  if (pairs == 0) return;
  constexpr int P = 16 / sizeof(T);
  if ((D / 2) % P == 0 && aligned16(qkv) && aligned16(cos_sin)) {
    const int64_t items = pairs / P;
    launch("rope", rope_packed_kernel<T>, dim3(static_cast<unsigned>(std::min<int64_t>(ceil_div(items, 256), 65535))), dim3(256), 0, stream, qkv,
           cos_sin, items, T_, static_cast<int>(H), static_cast<int>(D), inverse ? -1.0f : 1.0f);
    return;
  }
  launch("rope", rope_kernel<T>, dim3(static_cast<unsigned>(std::min<int64_t>(ceil_div(pairs, 256), 65535))), dim3(256), 0, stream, qkv, cos_sin,
         pairs, T_, H, D, inverse ? -1.0f : 1.0f);
}

template void rope<float>(float*, const float*, int64_t, int64_t, int64_t, int64_t, bool, cudaStream_t);
template void rope<bf16>(bf16*, const float*, int64_t, int64_t, int64_t, int64_t, bool, cudaStream_t);

}  // namespace multinorm::cuda
