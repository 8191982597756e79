// The C interface of the CUDA backend plugin (libmultinorm_cuda.so). The multinorm binary never
// links CUDA: it dlopen()s the plugin and resolves these symbols, so it starts on machines without
// CUDA libraries and falls back to the CPU backend. Bump the ABI version on any change.
#pragma once
#include <stddef.h>

#define MULTINORM_CUDA_PLUGIN_ABI 1

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

#ifdef __cplusplus
}
#endif
