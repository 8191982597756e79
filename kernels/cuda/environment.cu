// What `multinorm doctor` asks the plugin about the machine: the CUDA driver and runtime, the
// cuBLASLt and NCCL the process loaded (version and file), every visible GPU; and NCCL across the
// GPUs of this node in one process (all-reduce, reduce-scatter, all-gather checked against a host
// sum, then their bus bandwidth), as nccl-tests measures it.
#if defined(MULTINORM_HAVE_NCCL)
#include <nccl.h>  // first: it brings cuda_runtime.h, which the emulation's kernel macros must not precede
#endif

#include <dlfcn.h>

#include <cstdio>
#include <string>
#include <vector>

#include "check.h"
#include "multinorm/cuda_plugin_abi.h"

namespace {

std::string quoted(const std::string& s) {
  std::string q = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') q += '\\';
    if (static_cast<unsigned char>(c) >= 0x20) q += c;
  }
  return q + "\"";
}

// The file a symbol of the process came from ("" if unknown).
std::string library_of(const void* symbol) {
  Dl_info info{};
  if (symbol && ::dladdr(symbol, &info) && info.dli_fname) return info.dli_fname;
  return "";
}

int attribute(cudaDeviceAttr a, int device) {
  int v = 0;
  if (cudaDeviceGetAttribute(&v, a, device) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return v;
}

// The probes visit every device; the caller's current device (a backend's GPU) is left as it was.
class KeepCurrentDevice {
 public:
  KeepCurrentDevice() {
    if (cudaGetDevice(&device_) != cudaSuccess) cudaGetLastError(), device_ = -1;
  }
  ~KeepCurrentDevice() {
    if (device_ >= 0) cudaSetDevice(device_);
  }
  KeepCurrentDevice(const KeepCurrentDevice&) = delete;
  KeepCurrentDevice& operator=(const KeepCurrentDevice&) = delete;

 private:
  int device_ = -1;
};

int write_out(const std::string& s, char* out, size_t len) {
  if (!out || len == 0) return -1;
  std::snprintf(out, len, "%s", s.c_str());
  return s.size() < len ? 0 : -1;
}

}  // namespace

extern "C" int multinorm_cuda_environment(char* out, size_t len) {
  const KeepCurrentDevice keep;
  std::string j = "{";
  int runtime = 0, driver = 0;
  cudaRuntimeGetVersion(&runtime);
  if (cudaDriverGetVersion(&driver) != cudaSuccess) cudaGetLastError();
  j += "\"runtime_version\": " + std::to_string(runtime) + ", \"driver_version\": " + std::to_string(driver);
#if MN_EMULATED
  j += ", \"cublaslt\": {\"version\": 0, \"path\": \"emulated\"}, \"nccl\": {\"version\": 0, \"path\": \"emulated\"}";
#else
  j += ", \"cublaslt\": {\"version\": " + std::to_string(cublasLtGetVersion()) +
       ", \"path\": " + quoted(library_of(reinterpret_cast<const void*>(&cublasLtGetVersion))) + "}";
#if defined(MULTINORM_HAVE_NCCL)
  int nccl = 0;
  ncclGetVersion(&nccl);
  j += ", \"nccl\": {\"version\": " + std::to_string(nccl) + ", \"path\": " + quoted(library_of(reinterpret_cast<const void*>(&ncclGetVersion))) + "}";
#else
  j += ", \"nccl\": null";
#endif
#endif
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    n = 0;
  }
  j += ", \"devices\": [";
  for (int d = 0; d < n; ++d) {
    char name[256] = "unknown", bus[32] = "";
#if MN_EMULATED
    std::snprintf(name, sizeof name, "CUDA emulation on the CPU (sm_80 limits)");
#else
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, d) == cudaSuccess) std::snprintf(name, sizeof name, "%s", prop.name);
    cudaDeviceGetPCIBusId(bus, sizeof bus, d);
#endif
    size_t free_b = 0, total_b = 0;
    cudaSetDevice(d);
    cudaMemGetInfo(&free_b, &total_b);
    const int mem_khz = attribute(cudaDevAttrMemoryClockRate, d), bus_bits = attribute(cudaDevAttrGlobalMemoryBusWidth, d);
    // Peak DRAM bandwidth: two transfers per memory clock (DDR) over the bus.
    const double peak_gbs = mem_khz > 0 && bus_bits > 0 ? 2.0 * mem_khz * 1e3 * bus_bits / 8 / 1e9 : 0;
    j += std::string(d ? ", " : "") + "{\"index\": " + std::to_string(d) + ", \"name\": " + quoted(name) + ", \"pci_bus\": " + quoted(bus) +
         ", \"cc\": \"" + std::to_string(attribute(cudaDevAttrComputeCapabilityMajor, d)) + "." +
         std::to_string(attribute(cudaDevAttrComputeCapabilityMinor, d)) + "\", \"sms\": " +
         std::to_string(attribute(cudaDevAttrMultiProcessorCount, d)) + ", \"memory_bytes\": " + std::to_string(total_b) +
         ", \"free_bytes\": " + std::to_string(free_b) + ", \"ecc\": " + std::to_string(attribute(cudaDevAttrEccEnabled, d)) +
         ", \"sm_clock_mhz\": " + std::to_string(attribute(cudaDevAttrClockRate, d) / 1000) +
         ", \"memory_clock_mhz\": " + std::to_string(mem_khz / 1000) + ", \"bus_width_bits\": " + std::to_string(bus_bits) +
         ", \"l2_bytes\": " + std::to_string(attribute(cudaDevAttrL2CacheSize, d)) +
         ", \"peak_bandwidth_gbs\": " + std::to_string(peak_gbs) + "}";
  }
  j += "]}";
  return write_out(j, out, len);
}

// NCCL over the first `ndev` GPUs of this process: each collective on `count` floats checked exactly
// against the host (integers below 2^24: every order of the sum is exact), then timed on `bench_bytes`.
// Writes a JSON object; returns 0 when every check passed, 1 when one failed, -1 when it could not run.
extern "C" int multinorm_cuda_nccl_selftest(int ndev, size_t bench_bytes, char* out, size_t len) {
#if !defined(MULTINORM_HAVE_NCCL) || MN_EMULATED
  (void)ndev, (void)bench_bytes;
  return write_out("{\"skipped\": \"no NCCL in this plugin build\"}", out, len) == 0 ? -1 : -1;
#else
  const KeepCurrentDevice keep;
  std::string j = "{\"gpus\": " + std::to_string(ndev) + ", \"collectives\": [";
  std::vector<ncclComm_t> comms(ndev);
  std::vector<int> devs(ndev);
  for (int d = 0; d < ndev; ++d) devs[d] = d;
  auto fail = [&](const std::string& what) {
    for (ncclComm_t c : comms)
      if (c) ncclCommDestroy(c);
    write_out("{\"gpus\": " + std::to_string(ndev) + ", \"error\": " + quoted(what) + "}", out, len);
    return -1;
  };
  if (ncclCommInitAll(comms.data(), ndev, devs.data()) != ncclSuccess) return fail("ncclCommInitAll failed");
  const size_t check_count = 1 << 20;                                       // per rank
  const size_t bench_count = std::max<size_t>(bench_bytes / 4, check_count);  // floats
  std::vector<float*> send(ndev), recv(ndev);
  std::vector<cudaStream_t> streams(ndev);
  for (int d = 0; d < ndev; ++d) {
    cudaSetDevice(d);
    if (cudaMalloc(&send[d], bench_count * 4) != cudaSuccess || cudaMalloc(&recv[d], bench_count * 4 * ndev) != cudaSuccess ||
        cudaStreamCreate(&streams[d]) != cudaSuccess)
      return fail("allocating " + std::to_string(bench_count * 4 * (ndev + 1)) + " bytes on GPU " + std::to_string(d));
    std::vector<float> h(check_count);
    for (size_t i = 0; i < check_count; ++i) h[i] = float((d + 1) * (i % 7));
    cudaMemcpy(send[d], h.data(), check_count * 4, cudaMemcpyHostToDevice);
  }
  enum Kind { AllReduce, ReduceScatter, AllGather };
  const char* names[] = {"all_reduce", "reduce_scatter", "all_gather"};
  auto run = [&](Kind k, size_t count) {  // count: floats each rank sends
    ncclGroupStart();
    for (int d = 0; d < ndev; ++d) {
      if (k == AllReduce) ncclAllReduce(send[d], recv[d], count, ncclFloat32, ncclSum, comms[d], streams[d]);
      if (k == ReduceScatter) ncclReduceScatter(send[d], recv[d], count / ndev, ncclFloat32, ncclSum, comms[d], streams[d]);
      if (k == AllGather) ncclAllGather(send[d], recv[d], count, ncclFloat32, comms[d], streams[d]);
    }
    return ncclGroupEnd();
  };
  bool all_ok = true;
  for (int k = 0; k < 3; ++k) {
    const Kind kind = static_cast<Kind>(k);
    if (run(kind, check_count) != ncclSuccess) return fail(std::string(names[k]) + " failed");
    for (int d = 0; d < ndev; ++d) cudaSetDevice(d), cudaStreamSynchronize(streams[d]);
    // Exact check on every rank: the sum over ranks of (r + 1) (i % 7), or rank r's block gathered.
    size_t wrong = 0;
    const double ranks_sum = ndev * (ndev + 1) / 2.0;
    for (int d = 0; d < ndev; ++d) {
      const size_t n = kind == AllReduce ? check_count : kind == ReduceScatter ? check_count / ndev : check_count * ndev;
      std::vector<float> h(n);
      cudaSetDevice(d);
      cudaMemcpy(h.data(), recv[d], n * 4, cudaMemcpyDeviceToHost);
      for (size_t i = 0; i < n; ++i) {
        double expect;
        if (kind == AllReduce) expect = ranks_sum * (i % 7);
        else if (kind == ReduceScatter) expect = ranks_sum * ((d * (check_count / ndev) + i) % 7);
        else expect = double((i / check_count) + 1) * ((i % check_count) % 7);
        wrong += h[i] != expect;
      }
    }
    // Bus bandwidth (nccl-tests' definition): algorithm bandwidth times 2(n-1)/n for an all-reduce,
    // (n-1)/n for the others; the mean of 5 timed runs after one warm-up.
    cudaEvent_t a, b;
    cudaSetDevice(0);
    cudaEventCreate(&a), cudaEventCreate(&b);
    run(kind, bench_count);
    for (int d = 0; d < ndev; ++d) cudaSetDevice(d), cudaStreamSynchronize(streams[d]);
    cudaSetDevice(0);
    cudaEventRecord(a, streams[0]);
    for (int r = 0; r < 5; ++r) run(kind, bench_count);
    cudaSetDevice(0);
    cudaEventRecord(b, streams[0]);
    for (int d = 0; d < ndev; ++d) cudaSetDevice(d), cudaStreamSynchronize(streams[d]);
    float ms = 0;
    cudaSetDevice(0);
    cudaEventElapsedTime(&ms, a, b);
    cudaEventDestroy(a), cudaEventDestroy(b);
    const double bytes = (kind == AllGather ? bench_count * ndev : bench_count) * 4.0, seconds = ms / 5 / 1e3;
    const double algbw = bytes / seconds / 1e9, factor = kind == AllReduce ? 2.0 * (ndev - 1) / ndev : double(ndev - 1) / ndev;
    all_ok = all_ok && wrong == 0;
    j += std::string(k ? ", " : "") + "{\"name\": \"" + names[k] + "\", \"wrong_elements\": " + std::to_string(wrong) +
         ", \"bytes\": " + std::to_string(static_cast<long long>(bytes)) + ", \"ms\": " + std::to_string(ms / 5) +
         ", \"bus_bandwidth_gbs\": " + std::to_string(algbw * factor) + "}";
  }
  for (int d = 0; d < ndev; ++d) {
    cudaSetDevice(d);
    cudaFree(send[d]), cudaFree(recv[d]), cudaStreamDestroy(streams[d]);
    ncclCommDestroy(comms[d]);
  }
  j += "]}";
  write_out(j, out, len);
  return all_ok ? 0 : 1;
#endif
}
