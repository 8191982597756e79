// Rotary position embedding in place on the q and k sections of qkv[B*T, 3*H*D], rotate-half pairs
// (i, i + D/2) (formula: kernels/common/op_math.h); the backward pass is the inverse rotation.
// One thread per rotated pair: B T 2 H D/2 threads. bytes: 2 B T 2C sizeof(T) (q and k read and
// written) + the cos/sin table (L2-resident); 6 FLOPs per pair.
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

}  // namespace

template <class T>
void rope(T* qkv, const float* cos_sin, int64_t B, int64_t T_, int64_t H, int64_t D, bool inverse, cudaStream_t stream) {
  const int64_t pairs = B * T_ * 2 * H * (D / 2);
  if (pairs == 0) return;
  launch("rope", rope_kernel<T>, dim3(static_cast<unsigned>(std::min<int64_t>(ceil_div(pairs, 256), 65535))), dim3(256), 0, stream, qkv, cos_sin,
         pairs, T_, H, D, inverse ? -1.0f : 1.0f);
}

template void rope<float>(float*, const float*, int64_t, int64_t, int64_t, int64_t, bool, cudaStream_t);
template void rope<bf16>(bf16*, const float*, int64_t, int64_t, int64_t, int64_t, bool, cudaStream_t);

}  // namespace multinorm::cuda
