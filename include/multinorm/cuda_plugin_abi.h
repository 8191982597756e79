// The C interface of the CUDA backend plugin (libmultinorm_cuda.so, or its emulated build
// libmultinorm_cuda_emulated.so). The multinorm binary never links CUDA: it dlopen()s the plugin and
// resolves these symbols, so it starts on machines without CUDA libraries and falls back to the CPU
// backend. The backend object crosses as a multinorm::Backend* (the C++ seam of
// include/multinorm/backend.h, compiled by the same g++ on both sides): bump the ABI version on any
// change of this file, of backend.h or of the headers it includes (SwanArgs: optimizer_kernels.h).
#pragma once
#include <stddef.h>

#define MULTINORM_CUDA_PLUGIN_ABI 13

#ifdef __cplusplus
extern "C" {
#endif

typedef struct multinorm_cuda_device_info {
  char name[256];
  int cc_major, cc_minor;
  size_t total_memory_bytes;
  int multiprocessors;
} multinorm_cuda_device_info;

// The ABI version the plugin was built with (MULTINORM_CUDA_PLUGIN_ABI).
int multinorm_cuda_plugin_abi(void);
// The CUDA runtime version the plugin was built against (e.g. 13000).
int multinorm_cuda_runtime_version(void);
// Number of usable GPUs (>= 0); on any CUDA error returns -1 and writes the error text to `err`.
int multinorm_cuda_device_count(char* err, size_t err_len);
// Fills `info` for `device`; returns 0 or -1 with the error text in `err`.
int multinorm_cuda_device_query(int device, multinorm_cuda_device_info* info, char* err, size_t err_len);
// 1 for the emulated build (kernels executed on the CPU: a test instrument, never picked by "auto").
int multinorm_cuda_plugin_emulated(void);
// A new multinorm::Backend on `device` (delete it through the pointer), or NULL with the error text.
void* multinorm_cuda_create_backend(int device, char* err, size_t err_len);
// What the plugin sees of the machine, as a JSON object in `out`: runtime and driver versions, the
// cuBLASLt and NCCL loaded (version, file), every visible GPU (name, PCI bus, compute capability,
// SMs, memory, ECC, clocks, bus width, L2, peak bandwidth). 0, or -1 when `out` is too small.
int multinorm_cuda_environment(char* out, size_t len);
// NCCL across the first `ndev` GPUs of this process (ncclCommInitAll): all-reduce, reduce-scatter and
// all-gather checked exactly against the host, then timed on `bench_bytes` per rank (bus bandwidth).
// A JSON object in `out`; 0 when every check passed, 1 when one failed, -1 when it could not run.
int multinorm_cuda_nccl_selftest(int ndev, size_t bench_bytes, char* out, size_t len);

#ifdef __cplusplus
}
#endif
