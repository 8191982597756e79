// Launch limits of the emulated build (launch_limits.h), and the ptxas report they read.
//
// The report: every file under the report directory holds nvcc's stderr for one source, with lines
//   ptxas info    : Compiling entry function '_ZN...' for 'sm_80'
//   ptxas info    : Used 96 registers, used 1 barriers, 1056 bytes smem, 400 bytes cmem[0]
// The directory is $MULTINORM_KERNEL_RESOURCES, else the build's (MULTINORM_KERNEL_RESOURCES_DIR).
#include "launch_limits.h"

#include <dirent.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <string>

#include "symbols.h"

namespace cuda_emu::limits {
namespace {

struct Report {
  std::map<std::string, KernelFigures> by_signature;
  std::string source;
};

// The number right before `suffix` in `line` (e.g. "96" in "Used 96 registers"), or -1.
long number_before(const std::string& line, const std::string& suffix) {
  const size_t at = line.find(suffix);
  if (at == std::string::npos || at == 0) return -1;
  size_t begin = at;
  while (begin > 0 && std::isdigit(static_cast<unsigned char>(line[begin - 1]))) --begin;
  return begin == at ? -1 : std::atol(line.c_str() + begin);
}

void read_file(const std::string& path, Report& r) {
  std::ifstream in(path);
  const std::string entry = "Compiling entry function '";
  std::string line, current;
  while (std::getline(in, line)) {
    if (const size_t at = line.find(entry); at != std::string::npos) {
      const size_t begin = at + entry.size(), end = line.find('\'', begin);
      current = symbols::demangle(line.substr(begin, end - begin).c_str());
      r.by_signature.emplace(current, KernelFigures{});
    } else if (!current.empty() && line.find("Used ") != std::string::npos) {
      KernelFigures& f = r.by_signature[current];
      f.registers = std::max<int>(f.registers, static_cast<int>(number_before(line, " registers")));
      f.static_shared = std::max(f.static_shared, std::max(0L, number_before(line, " bytes smem")));
      current.clear();
    }
  }
}

Report load_report() {
  Report r;
  std::string dir;
  if (const char* e = std::getenv("MULTINORM_KERNEL_RESOURCES"); e && *e) dir = e;
#ifdef MULTINORM_KERNEL_RESOURCES_DIR
  else dir = MULTINORM_KERNEL_RESOURCES_DIR;
#endif
  if (dir.empty()) return r;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name.size() > 6 && name.compare(name.size() - 6, 6, ".ptxas") == 0) read_file(dir + "/" + name, r);
    }
    ::closedir(d);
  }
  r.source = dir;
  return r;
}

std::mutex g_mu;
Report& report() {
  static Report r = load_report();
  return r;
}
std::map<const void*, KernelFigures> g_cache;      // by kernel address
// cudaFuncAttributeMaxDynamicSharedMemorySize, per (device, kernel): each device's context has its own
std::map<std::pair<int, const void*>, int> g_max_dynamic;

KernelFigures figures_locked(const void* fn) {
  auto it = g_cache.find(fn);
  if (it != g_cache.end()) return it->second;
  KernelFigures f;
  const auto& table = report().by_signature;
  if (!table.empty()) {
    auto t = table.find(symbols::function_name(fn));
    if (t != table.end()) f = t->second;
  }
  g_cache[fn] = f;
  return f;
}

int current_device() {
  int d = 0;
  cudaGetDevice(&d);
  return d;
}

std::string kb(size_t bytes) { return std::to_string(bytes) + " B"; }

}  // namespace

KernelFigures figures(const void* fn) {
  std::lock_guard<std::mutex> lock(g_mu);
  return figures_locked(fn);
}

int report_size(std::string* source) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (source) *source = report().source;
  return static_cast<int>(report().by_signature.size());
}

void set_figures_for_test(const void* fn, KernelFigures f) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_cache[fn] = f;
}

cudaError_t set_max_dynamic_shared(const void* fn, int bytes) {
  std::lock_guard<std::mutex> lock(g_mu);
  const KernelFigures f = figures_locked(fn);
  const long static_bytes = std::max(0L, f.static_shared);
  if (bytes < 0 || static_cast<size_t>(bytes) + static_bytes > kSharedOptinMax) return cudaErrorInvalidValue;
  g_max_dynamic[{current_device(), fn}] = bytes;
  return cudaSuccess;
}

std::string check_launch(const void* fn, dim3 grid, dim3 block, size_t dynamic_shared) {
  const uint64_t threads = static_cast<uint64_t>(block.x) * block.y * block.z;
  if (threads == 0 || threads > 1024) return "a block must have 1..1024 threads (cudaErrorInvalidConfiguration)";
  if (block.z > 64) return "blockDim.z > 64 (cudaErrorInvalidConfiguration)";
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return "empty grid (cudaErrorInvalidConfiguration)";
  if (grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535)
    return "gridDim.x must be at most 2^31 - 1, .y and .z at most 65535 (cudaErrorInvalidConfiguration)";
  std::lock_guard<std::mutex> lock(g_mu);
  const KernelFigures f = fn ? figures_locked(fn) : KernelFigures{};
  // The backend's tests ask that every kernel they launch be in the report (the matching works, and
  // the report is not stale).
  if (const char* req = std::getenv("MULTINORM_EMU_REQUIRE_FIGURES"); req && *req == '1' && f.registers < 0 && !report().by_signature.empty())
    return "kernel " + symbols::function_name(fn) + " is not in the ptxas report under " + report().source +
           " (a stale build, or a kernel nvcc did not compile)";
  const size_t static_bytes = f.static_shared > 0 ? static_cast<size_t>(f.static_shared) : 0;
  if (static_bytes > kStaticSharedMax)
    return kb(static_bytes) + " of static shared memory: at most " + kb(kStaticSharedMax) + " (larger tiles must be dynamic, with opt-in)";
  auto attr = fn ? g_max_dynamic.find({current_device(), fn}) : g_max_dynamic.end();
  const size_t max_dynamic = attr != g_max_dynamic.end() ? static_cast<size_t>(attr->second) : kStaticSharedMax - static_bytes;
  if (dynamic_shared > max_dynamic)
    return kb(dynamic_shared) + " of dynamic shared memory (+ " + kb(static_bytes) + " static) exceeds the kernel's limit of " +
           kb(max_dynamic) +
           (attr == g_max_dynamic.end() ? " (above 48 KB needs cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) first)"
                                        : " set by cudaFuncSetAttribute") +
           " (cudaErrorInvalidValue)";
  if (f.registers > 0) {
    const int per_warp = (f.registers * 32 + kRegisterAllocationUnit - 1) / kRegisterAllocationUnit * kRegisterAllocationUnit;
    const int warps = static_cast<int>((threads + 31) / 32);
    if (per_warp * warps > kRegistersPerBlock)
      return std::to_string(threads) + " threads x " + std::to_string(f.registers) + " registers (ptxas) need " +
             std::to_string(per_warp * warps) + " registers, more than a block's " + std::to_string(kRegistersPerBlock) +
             " (cudaErrorLaunchOutOfResources: too many resources requested for launch)";
  }
  return "";
}

}  // namespace cuda_emu::limits
