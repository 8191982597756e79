#include "multinorm/device.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <mutex>

#include "multinorm/error.h"

namespace multinorm {

std::string executable_dir() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  buf[n] = '\0';
  std::string p(buf);
  const auto slash = p.find_last_of('/');
  return slash == std::string::npos ? "." : p.substr(0, slash);
}

namespace {

CudaProbe do_probe() {
  CudaProbe probe;
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("MULTINORM_CUDA_PLUGIN"); env && *env) candidates.push_back(env);
  const std::string dir = executable_dir();
  candidates.push_back(dir + "/libmultinorm_cuda.so");
  candidates.push_back(dir + "/../lib/libmultinorm_cuda.so");

  void* handle = nullptr;
  std::string errors;
  for (const auto& path : candidates) {
    if (::access(path.c_str(), F_OK) != 0) continue;
    handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle) {
      probe.plugin_path = path;
      break;
    }
    errors += std::string(errors.empty() ? "" : "; ") + ::dlerror();
  }
  if (!handle) {
    if (errors.empty()) {
      errors = "no CUDA plugin (searched";
      for (const auto& c : candidates) errors += " " + c;
      errors += ")";
    }
    probe.load_error = errors;
    return probe;
  }
  using AbiFn = int (*)();
  using CountFn = int (*)(char*, size_t);
  using QueryFn = int (*)(int, multinorm_cuda_device_info*, char*, size_t);
  auto abi = reinterpret_cast<AbiFn>(::dlsym(handle, "multinorm_cuda_plugin_abi"));
  auto version = reinterpret_cast<AbiFn>(::dlsym(handle, "multinorm_cuda_runtime_version"));
  auto count = reinterpret_cast<CountFn>(::dlsym(handle, "multinorm_cuda_device_count"));
  auto query = reinterpret_cast<QueryFn>(::dlsym(handle, "multinorm_cuda_device_query"));
  if (!abi || !version || !count || !query) {
    probe.load_error = probe.plugin_path + ": missing plugin symbols (not a multinorm CUDA plugin?)";
    return probe;
  }
  if (abi() != MULTINORM_CUDA_PLUGIN_ABI) {
    probe.load_error = probe.plugin_path + ": plugin ABI " + std::to_string(abi()) + ", binary expects " +
                       std::to_string(MULTINORM_CUDA_PLUGIN_ABI) + " (rebuild both)";
    return probe;
  }
  probe.plugin_loaded = true;
  probe.runtime_version = version();
  char err[512] = {0};
  const int n = count(err, sizeof(err));
  if (n < 0) {
    probe.device_error = err;
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

}  // namespace

const CudaProbe& probe_cuda() {
  static std::once_flag once;
  static CudaProbe probe;
  std::call_once(once, [] { probe = do_probe(); });
  return probe;
}

BackendChoice choose_backend(const std::string& requested) {
  if (requested == "cpu") return {BackendKind::Cpu, "cpu (requested)"};
  if (requested != "auto" && requested != "cuda")
    throw ConfigError("backend: unknown backend '" + requested + "' (expected auto, cpu or cuda)");
  const CudaProbe& p = probe_cuda();
  std::string why;
  if (!p.plugin_loaded) why = "CUDA plugin not loaded: " + p.load_error;
  else if (p.device_count == 0) why = "no GPU: " + (p.device_error.empty() ? std::string("0 devices") : p.device_error);
  if (why.empty()) {
    // The CUDA backend itself (model, optimizers) is not built yet: say so rather than pretend.
    why = std::to_string(p.device_count) + " GPU(s) found, but the CUDA training backend is not implemented yet";
  }
  if (requested == "cuda") throw Error("backend cuda requested, but it cannot be used: " + why);
  return {BackendKind::Cpu, "cpu (auto: " + why + ")"};
}

}  // namespace multinorm
