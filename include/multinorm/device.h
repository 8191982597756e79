// Backend selection: probe the CUDA plugin (dlopen, never a link-time dependency) and pick the
// backend a run asked for: auto | cpu | cuda.
#pragma once
#include <memory>
#include <string>

#include "multinorm/config_choices.h"
#include <vector>

#include "multinorm/backend.h"
#include "multinorm/cuda_libraries.h"
#include "multinorm/cuda_plugin_abi.h"

namespace multinorm {

struct CudaProbe {
  std::string plugin_path;   // where the plugin was found ("" when not found)
  bool plugin_loaded = false;
  std::string load_error;    // dlopen/dlsym error, or "not found" with the searched paths
  int runtime_version = 0;
  int device_count = 0;      // usable GPUs
  std::string device_error;  // cudaGetDeviceCount's error when it failed
  int device_error_code = 0; // its cudaError_t (100: no device)
  bool driver_loaded = false;  // the NVIDIA driver's libcuda.so.1 is in the process
  std::vector<multinorm_cuda_device_info> devices;
  bool emulated = false;          // the emulated build: kernels run on the CPU (tests only)
  CudaLibraries libraries;        // the CUDA libraries loaded for the plugin, and from where
  void* (*create)(int, char*, size_t) = nullptr;  // multinorm_cuda_create_backend
  int (*environment)(char*, size_t) = nullptr;    // multinorm_cuda_environment
  int (*nccl_selftest)(int, size_t, char*, size_t) = nullptr;  // multinorm_cuda_nccl_selftest
};

// Probes once per process. Search order: $MULTINORM_CUDA_PLUGIN, the binary's directory,
// <binary dir>/../lib.
const CudaProbe& probe_cuda();
// Loads the plugin at `path` (not cached; tests load the emulated plugin this way).
CudaProbe probe_cuda_plugin(const std::string& path);

enum class BackendKind { Cpu, Cuda };

struct BackendChoice {
  BackendKind kind;
  std::string reason;  // one line for the log, e.g. "cpu (no GPU: cudaGetDeviceCount: ...)"
};

// "auto" falls back to the CPU when no GPU is usable; "cuda" without one is an Error. "cuda" with the
// emulated plugin (MULTINORM_CUDA_PLUGIN=.../libmultinorm_cuda_emulated.so) runs the CUDA backend's
// kernels on the CPU, slowly; "auto" never picks the emulation.
BackendChoice choose_backend(BackendRequest requested);
BackendChoice choose_backend(const std::string& requested);  // a command-line --backend: its name parsed
// Why `auto` must not fall back to the CPU for this probe ("" when it may): a machine with an NVIDIA
// driver whose GPUs the CUDA runtime cannot use (a driver too old for the plugin's CUDA, devices busy
// or in an error state) is a broken GPU node, not a CPU machine; training there on the CPU would be
// silent and hundreds of times slower.
std::string auto_refusal(const CudaProbe& probe);

// The backend a choice names: the CPU backend with `threads` OpenMP threads (0: all cores), or the
// CUDA backend on device 0 of the probed plugin.
// On CUDA, the GPU is the launcher's node-local rank modulo the GPUs visible (one rank per GPU on an
// 8-GPU node launched with 8 ranks per node).
std::unique_ptr<Backend> make_backend(const BackendChoice& choice, int threads);
// The CUDA backend of a loaded plugin on `device`; throws Error when it cannot be created.
std::unique_ptr<Backend> make_cuda_backend(const CudaProbe& probe, int device = 0);

}  // namespace multinorm
