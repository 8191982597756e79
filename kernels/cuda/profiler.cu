// Per-kernel times from CUDA event pairs (profiler.h). Events are pooled: a profiled step creates
// none once the pool is warm.
#include "profiler.h"

#include <algorithm>
#include <map>

#include "check.h"

namespace multinorm::cuda::profiler {

bool g_on = false;

namespace {
struct Record {
  const char* name;
  cudaEvent_t start, stop;
};
std::vector<Record> g_records;
std::vector<cudaEvent_t> g_pool;
const char* g_open = nullptr;
cudaEvent_t g_open_start = nullptr;

cudaEvent_t take_event() {
  if (!g_pool.empty()) {
    cudaEvent_t e = g_pool.back();
    g_pool.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  MN_CUDA_CHECK(cudaEventCreate(&e), "creating a profiling event");
  return e;
}
}  // namespace

void set(bool on) { g_on = on; }

void begin(const char* name, cudaStream_t stream) {
  g_open = name;
  g_open_start = take_event();
  MN_CUDA_CHECK(cudaEventRecord(g_open_start, stream), std::string("profiling ") + name);
}

void end(cudaStream_t stream) {
  if (!g_open) return;
  cudaEvent_t stop = take_event();
  MN_CUDA_CHECK(cudaEventRecord(stop, stream), std::string("profiling ") + g_open);
  g_records.push_back({g_open, g_open_start, stop});
  g_open = nullptr;
}

std::vector<KernelTime> take() {
  std::map<std::string, KernelTime> by_name;
  for (const Record& r : g_records) {
    MN_CUDA_CHECK(cudaEventSynchronize(r.stop), std::string("profiling ") + r.name);
    float ms = 0;
    MN_CUDA_CHECK(cudaEventElapsedTime(&ms, r.start, r.stop), std::string("profiling ") + r.name);
    KernelTime& k = by_name[r.name];
    k.name = r.name;
    ++k.launches;
    k.ms += ms;
    g_pool.push_back(r.start);
    g_pool.push_back(r.stop);
  }
  g_records.clear();
  std::vector<KernelTime> v;
  for (auto& [name, k] : by_name) v.push_back(k);
  std::sort(v.begin(), v.end(), [](const KernelTime& a, const KernelTime& b) { return a.ms > b.ms; });
  return v;
}

}  // namespace multinorm::cuda::profiler
