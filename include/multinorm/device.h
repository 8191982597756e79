// Backend selection: probe the CUDA plugin (dlopen, never a link-time dependency) and pick the
// backend a run asked for: auto | cpu | cuda.
#pragma once
#include <string>
#include <vector>

#include "multinorm/cuda_plugin_abi.h"

namespace multinorm {

struct CudaProbe {
  std::string plugin_path;   // where the plugin was found ("" when not found)
  bool plugin_loaded = false;
  std::string load_error;    // dlopen/dlsym error, or "not found" with the searched paths
  int runtime_version = 0;
  int device_count = 0;      // usable GPUs
  std::string device_error;  // cudaGetDeviceCount's error when it failed
  std::vector<multinorm_cuda_device_info> devices;
};

// Probes once per process. Search order: $MULTINORM_CUDA_PLUGIN, the binary's directory,
// <binary dir>/../lib.
const CudaProbe& probe_cuda();

enum class BackendKind { Cpu, Cuda };

struct BackendChoice {
  BackendKind kind;
  std::string reason;  // one line for the log, e.g. "cpu (no GPU: cudaGetDeviceCount: ...)"
};

// "auto" falls back to the CPU when no GPU is usable; "cuda" without one is an Error.
BackendChoice choose_backend(const std::string& requested);

std::string executable_dir();

}  // namespace multinorm
