// MN_HOST_DEVICE marks a function of kernels/common/ that both backends call: a host function for the
// CPU, and under nvcc also a device function for the CUDA kernels (the emulated build compiles the
// CUDA kernels as host code, so plain inline serves it).
#pragma once

#if defined(__CUDACC__)
#define MN_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define MN_HOST_DEVICE inline
#endif
