// The CUDA libraries the plugin needs but no bundle carries (cuBLASLt, NCCL, a dynamic CUDA runtime:
// hundreds of MB, and every GPU node has them), found where GPU nodes keep them and loaded before the
// plugin, so that its own dependencies resolve to them:
//   1. the dynamic loader's own search (LD_LIBRARY_PATH, the binary's RUNPATH, ld.so.cache);
//   2. $CUDA_HOME, $CUDA_PATH, $CUDA_ROOT (lib64, lib), /usr/local/cuda/lib64, /usr/local/cuda-*/lib64
//      (newest first);
//   3. Python environments: $VIRTUAL_ENV, $CONDA_PREFIX and the prefix of every python3 on PATH:
//      lib/python3*/site-packages/nvidia/*/lib (the pip wheels nvidia-cublas, nvidia-nccl-cu13, ...).
// The driver (libcuda.so.1) is the system's: the CUDA runtime opens it by name.
#pragma once
#include <string>
#include <vector>

namespace multinorm {

struct CudaLibrary {
  std::string soname;    // what the plugin asks for, e.g. libcublasLt.so.13
  std::string path;      // the file loaded ("" when not found)
  std::string found_by;  // "loader" or the directory it was found in
  std::string other_versions;  // when not found: files with the same stem and another version seen
};

struct CudaLibraries {
  std::vector<CudaLibrary> libraries;
  std::vector<std::string> searched;  // the directories of steps 2 and 3
  // "" when every library was found, else one line per missing library naming where it was looked
  // for, and other versions seen (a CUDA 12 cuBLASLt for a plugin built with CUDA 13).
  std::string missing() const;
};

// Reads the plugin's DT_NEEDED entries and loads, RTLD_GLOBAL, each CUDA library among them (cuBLAS,
// NCCL, cudart) from the first place above that has it. Idempotent per plugin path.
CudaLibraries preload_cuda_libraries(const std::string& plugin_path);

// The directories of steps 2 and 3, in search order.
std::vector<std::string> cuda_library_dirs();

}  // namespace multinorm
