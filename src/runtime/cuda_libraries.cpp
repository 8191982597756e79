// Finding the CUDA libraries the plugin needs (include/multinorm/cuda_libraries.h).
#include "multinorm/cuda_libraries.h"

#include <dlfcn.h>
#include <elf.h>
#include <glob.h>
#include <link.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <set>

namespace multinorm {
namespace {

// DT_NEEDED of an ELF64 file, read from its section headers (.dynamic and its string table).
std::vector<std::string> needed_libraries(const std::string& path) {
  std::vector<std::string> out;
  std::ifstream in(path, std::ios::binary);
  const std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (file.size() < sizeof(Elf64_Ehdr) || std::memcmp(file.data(), ELFMAG, SELFMAG) != 0) return out;
  const auto* eh = reinterpret_cast<const Elf64_Ehdr*>(file.data());
  if (eh->e_shoff == 0 || eh->e_shoff + uint64_t(eh->e_shnum) * sizeof(Elf64_Shdr) > file.size()) return out;
  const auto* sh = reinterpret_cast<const Elf64_Shdr*>(file.data() + eh->e_shoff);
  for (int i = 0; i < eh->e_shnum; ++i) {
    if (sh[i].sh_type != SHT_DYNAMIC || sh[i].sh_link >= eh->e_shnum) continue;
    const Elf64_Shdr& str = sh[sh[i].sh_link];
    if (sh[i].sh_offset + sh[i].sh_size > file.size() || str.sh_offset + str.sh_size > file.size()) return out;
    const auto* dyn = reinterpret_cast<const Elf64_Dyn*>(file.data() + sh[i].sh_offset);
    for (size_t k = 0; k < sh[i].sh_size / sizeof(Elf64_Dyn) && dyn[k].d_tag != DT_NULL; ++k)
      if (dyn[k].d_tag == DT_NEEDED && dyn[k].d_un.d_val < str.sh_size) out.emplace_back(file.data() + str.sh_offset + dyn[k].d_un.d_val);
  }
  return out;
}

bool is_cuda_library(const std::string& soname) {
  for (const char* stem : {"libcublasLt.so", "libcublas.so", "libnccl.so", "libcudart.so"})
    if (soname.rfind(stem, 0) == 0) return true;
  return false;
}

std::vector<std::string> glob_paths(const std::string& pattern) {
  std::vector<std::string> out;
  glob_t g{};
  if (::glob(pattern.c_str(), 0, nullptr, &g) == 0)
    for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  ::globfree(&g);
  return out;
}

bool is_dir(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string loaded_path(void* handle, const std::string& fallback) {
  link_map* map = nullptr;
  if (::dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map && map->l_name && *map->l_name) return map->l_name;
  return fallback;
}

}  // namespace

std::vector<std::string> cuda_library_dirs() {
  std::vector<std::string> dirs;
  for (const char* v : {"CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"})
    if (const char* e = std::getenv(v); e && *e)
      for (const char* sub : {"/lib64", "/lib", "/targets/x86_64-linux/lib"}) dirs.push_back(std::string(e) + sub);
  dirs.push_back("/usr/local/cuda/lib64");
  dirs.push_back("/usr/local/cuda/targets/x86_64-linux/lib");
  std::vector<std::string> versioned = glob_paths("/usr/local/cuda-*/lib64");
  std::sort(versioned.rbegin(), versioned.rend());  // cuda-13.0 before cuda-12.4
  dirs.insert(dirs.end(), versioned.begin(), versioned.end());
  // Python environments: the pip wheels put each library under site-packages/nvidia/<name>/lib
  // (CUDA 13's under nvidia/cu13/lib).
  std::vector<std::string> prefixes;
  for (const char* v : {"VIRTUAL_ENV", "CONDA_PREFIX"})
    if (const char* e = std::getenv(v); e && *e) prefixes.emplace_back(e);
  if (const char* path = std::getenv("PATH")) {
    std::string p(path);
    for (size_t at = 0; at <= p.size();) {
      const size_t colon = std::min(p.find(':', at), p.size());
      const std::string dir = p.substr(at, colon - at);
      if (!dir.empty() && ::access((dir + "/python3").c_str(), X_OK) == 0) prefixes.push_back(dir + "/..");
      at = colon + 1;
    }
  }
  for (const std::string& prefix : prefixes) {
    for (const std::string& d : glob_paths(prefix + "/lib/python3*/site-packages/nvidia/*/lib")) dirs.push_back(d);
    dirs.push_back(prefix + "/lib");  // conda installs the libraries themselves there
  }
  std::vector<std::string> unique;
  std::set<std::string> seen;
  for (auto& d : dirs)
    if (is_dir(d)) {
      char real[4096];
      const std::string key = ::realpath(d.c_str(), real) ? real : d;
      if (seen.insert(key).second) unique.push_back(key);
    }
  return unique;
}

std::string CudaLibraries::missing() const {
  std::string m;
  for (const CudaLibrary& l : libraries) {
    if (!l.path.empty()) continue;
    m += (m.empty() ? "" : "\n") + l.soname + " not found by the loader (LD_LIBRARY_PATH, ld.so.cache) nor in";
    for (const auto& d : searched) m += " " + d;
    if (searched.empty()) m += " any CUDA or Python directory";
    if (!l.other_versions.empty()) m += "; other versions seen: " + l.other_versions + " (the plugin was built against another CUDA)";
  }
  return m;
}

CudaLibraries preload_cuda_libraries(const std::string& plugin_path) {
  CudaLibraries r;
  std::vector<std::string> wanted;
  for (const std::string& n : needed_libraries(plugin_path))
    if (is_cuda_library(n)) wanted.push_back(n);
  if (wanted.empty()) return r;
  r.searched = cuda_library_dirs();
  for (const std::string& soname : wanted) {
    CudaLibrary lib;
    lib.soname = soname;
    if (void* h = ::dlopen(soname.c_str(), RTLD_NOW | RTLD_GLOBAL)) {
      lib.path = loaded_path(h, soname);
      lib.found_by = "loader";
    } else {
      for (const std::string& dir : r.searched) {
        const std::string file = dir + "/" + soname;
        if (::access(file.c_str(), R_OK) != 0) continue;
        if (void* h2 = ::dlopen(file.c_str(), RTLD_NOW | RTLD_GLOBAL)) {
          lib.path = loaded_path(h2, file);
          lib.found_by = dir;
          break;
        }
      }
    }
    if (lib.path.empty()) {  // name what is there instead: libcublasLt.so.12 beside a CUDA 13 plugin
      const std::string stem = soname.substr(0, soname.find(".so") + 3);
      for (const std::string& dir : r.searched)
        for (const std::string& f : glob_paths(dir + "/" + stem + ".*")) lib.other_versions += (lib.other_versions.empty() ? "" : ", ") + f;
    }
    r.libraries.push_back(lib);
  }
  return r;
}

}  // namespace multinorm
