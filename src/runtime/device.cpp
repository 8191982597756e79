#include "multinorm/device.h"

#include "multinorm/comm.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <mutex>

#include "multinorm/error.h"
#include "multinorm/install_paths.h"

namespace multinorm {

namespace {

// Loads one plugin file and queries its devices.
CudaProbe load_plugin(const std::string& path, void* handle) {
  CudaProbe probe;
  probe.plugin_path = path;
  using AbiFn = int (*)();
  using CountFn = int (*)(char*, size_t);
  using QueryFn = int (*)(int, multinorm_cuda_device_info*, char*, size_t);
  using CreateFn = void* (*)(int, char*, size_t);
  auto abi = reinterpret_cast<AbiFn>(::dlsym(handle, "multinorm_cuda_plugin_abi"));
  if (!abi) {
    probe.load_error = path + ": missing plugin symbols (not a multinorm CUDA plugin?)";
    return probe;
  }
  if (abi() != MULTINORM_CUDA_PLUGIN_ABI) {
    probe.load_error = path + ": plugin ABI " + std::to_string(abi()) + ", binary expects " + std::to_string(MULTINORM_CUDA_PLUGIN_ABI) +
                       " (rebuild both)";
    return probe;
  }
  auto version = reinterpret_cast<AbiFn>(::dlsym(handle, "multinorm_cuda_runtime_version"));
  auto emulated = reinterpret_cast<AbiFn>(::dlsym(handle, "multinorm_cuda_plugin_emulated"));
  auto count = reinterpret_cast<CountFn>(::dlsym(handle, "multinorm_cuda_device_count"));
  auto query = reinterpret_cast<QueryFn>(::dlsym(handle, "multinorm_cuda_device_query"));
  auto create = reinterpret_cast<CreateFn>(::dlsym(handle, "multinorm_cuda_create_backend"));
  auto environment = reinterpret_cast<int (*)(char*, size_t)>(::dlsym(handle, "multinorm_cuda_environment"));
  auto nccl_selftest = reinterpret_cast<int (*)(int, size_t, char*, size_t)>(::dlsym(handle, "multinorm_cuda_nccl_selftest"));
  if (!version || !emulated || !count || !query || !create || !environment || !nccl_selftest) {
    probe.load_error = path + ": missing plugin symbols (not a multinorm CUDA plugin?)";
    return probe;
  }
  probe.plugin_loaded = true;
  probe.runtime_version = version();
  probe.emulated = emulated() != 0;
  probe.create = create;
  probe.environment = environment;
  probe.nccl_selftest = nccl_selftest;
  char err[512] = {0};
  const int n = count(err, sizeof(err));
  probe.driver_loaded = ::dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD) != nullptr;
  if (n < 0) {
    probe.device_error = err;
    if (const char* c = std::strstr(err, "code ")) probe.device_error_code = std::atoi(c + 5);
    // The runtime reports a missing driver as an old one ("driver version is insufficient"): one
    // cause, the real one.
    if (!probe.driver_loaded) probe.device_error = "no NVIDIA driver on this machine: libcuda.so.1 not found";
    return probe;
  }
  for (int d = 0; d < n; ++d) {
    multinorm_cuda_device_info info{};
    if (query(d, &info, err, sizeof(err)) == 0) probe.devices.push_back(info);
  }
  probe.device_count = static_cast<int>(probe.devices.size());
  if (n > 0 && probe.device_count == 0) probe.device_error = err;
  return probe;
}

CudaProbe do_probe() {
  CudaProbe probe;
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("MULTINORM_CUDA_PLUGIN"); env && *env) candidates.push_back(env);
  const std::string dir = executable_dir();
  candidates.push_back(dir + "/libmultinorm_cuda.so");
  candidates.push_back(dir + "/../lib/libmultinorm_cuda.so");

  std::string errors;
  for (const auto& path : candidates) {
    if (::access(path.c_str(), F_OK) != 0) continue;
    // Plugins stay loaded for the life of the process (backends created from them may outlive any
    // scope), so the handle is never closed. Its CUDA libraries first, from where GPU nodes keep them.
    CudaLibraries libs = preload_cuda_libraries(path);
    void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle) {
      CudaProbe p = load_plugin(path, handle);
      p.libraries = std::move(libs);
      return p;
    }
    errors += std::string(errors.empty() ? "" : "; ") + ::dlerror();
    if (!libs.missing().empty()) errors += " (" + libs.missing() + ")";
    probe.libraries = std::move(libs);
  }
  if (errors.empty()) {
    errors = "no CUDA plugin (searched";
    for (const auto& c : candidates) errors += " " + c;
    errors += ")";
  }
  probe.load_error = errors;
  return probe;
}

}  // namespace

const CudaProbe& probe_cuda() {
  static std::once_flag once;
  static CudaProbe probe;
  std::call_once(once, [] { probe = do_probe(); });
  return probe;
}

CudaProbe probe_cuda_plugin(const std::string& path) {
  CudaLibraries libs = preload_cuda_libraries(path);
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    CudaProbe p;
    p.load_error = path + ": " + ::dlerror();
    if (!libs.missing().empty()) p.load_error += " (" + libs.missing() + ")";
    p.libraries = std::move(libs);
    return p;
  }
  CudaProbe p = load_plugin(path, handle);
  p.libraries = std::move(libs);
  return p;
}

std::string auto_refusal(const CudaProbe& p) {
  if (!p.plugin_loaded || p.emulated || p.device_count > 0 || !p.driver_loaded) return "";
  constexpr int kNoDevice = 100;  // cudaErrorNoDevice: a driver but no GPU, a CPU machine after all
  if (p.device_error_code == kNoDevice || p.device_error.empty()) return "";
  return "an NVIDIA driver is installed but its GPUs cannot be used: " + p.device_error +
         " (multinorm doctor says more; set backend: cpu to train on the CPU anyway)";
}

BackendChoice choose_backend(const std::string& requested) { return choose_backend(parse_choice<BackendRequest>(requested, "backend")); }

BackendChoice choose_backend(BackendRequest requested) {
  if (requested == BackendRequest::Cpu) return {BackendKind::Cpu, "cpu (requested)"};
  const CudaProbe& p = probe_cuda();
  std::string why;
  if (!p.plugin_loaded) why = "CUDA plugin not loaded: " + p.load_error;
  else if (p.device_count == 0) why = p.device_error.empty() ? std::string("no GPU: 0 devices") : p.device_error;
  if (requested == BackendRequest::Cuda) {
    if (!why.empty())
      throw Error("backend cuda requested, but it cannot be used: " + why + " (`multinorm devices` shows what is found; " +
                  "--set backend=cpu trains on the CPU)");
    if (p.emulated)
      return {BackendKind::Cuda, "cuda (emulated on the CPU by " + p.plugin_path + ": a test instrument, orders of magnitude slower; " +
                                     std::to_string(p.device_count) + " visible, the first: " + p.devices[0].name + ")"};
    return {BackendKind::Cuda, "cuda (" + std::string(p.devices[0].name) + ", " + p.plugin_path + ")"};
  }
  if (why.empty() && p.emulated) why = "the CUDA plugin is the CPU emulation (tests only)";  // never picked by auto
  if (const std::string refuse = auto_refusal(p); !refuse.empty()) throw Error("backend auto: " + refuse);
  if (why.empty())
    return {BackendKind::Cuda, "cuda (auto: " + std::string(p.devices[0].name) + ", " + p.plugin_path + ")"};
  return {BackendKind::Cpu, "cpu (auto: " + why + ")"};
}

std::unique_ptr<Backend> make_cuda_backend(const CudaProbe& probe, int device) {
  if (!probe.plugin_loaded || !probe.create) throw Error("CUDA backend: plugin not loaded: " + probe.load_error);
  char err[1024] = {0};
  void* backend = probe.create(device, err, sizeof(err));
  if (!backend) throw Error("CUDA backend on device " + std::to_string(device) + " (" + probe.plugin_path + "): " + err);
  return std::unique_ptr<Backend>(static_cast<Backend*>(backend));
}

std::unique_ptr<Backend> make_backend(const BackendChoice& choice, int threads) {
  if (choice.kind == BackendKind::Cuda) {
    const CudaProbe& p = probe_cuda();
    return make_cuda_backend(p, p.device_count > 0 ? launcher_world().local_rank % p.device_count : 0);
  }
  return make_cpu_backend(threads);
}

}  // namespace multinorm
