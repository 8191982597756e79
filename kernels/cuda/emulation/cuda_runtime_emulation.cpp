// The part of the CUDA runtime API the CUDA backend calls, for the emulated build: "device" memory is
// host memory in an address range of its own (device_memory.h), every allocation tracked, so copies
// and memsets are checked for their direction (a host pointer used where device memory is expected is
// an error here, as it would be on a GPU, and cudaGetErrorString names the pointer and what it is),
// and streams are in-order by construction (launches run synchronously).
#include <sys/sysinfo.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <string>
#include <vector>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>

#include "cuda_emulation.h"
#include "device_memory.h"
#include "launch_limits.h"

// A graph: its recorded work in order, and the nodes it owns (a conditional node owns its body graph,
// which the work that runs it shares, so an instantiated graph keeps it after the graph is destroyed).
struct CUgraphNode_st {
  std::shared_ptr<CUgraph_st> body;
  cudaGraph_t body_handle[1];  // what cudaGraphNodeParams::conditional.phGraph_out points at
};
struct CUgraph_st {
  std::vector<std::function<void()>> work;
  std::vector<std::unique_ptr<CUgraphNode_st>> nodes;
};
struct CUgraphExec_st {
  std::vector<std::function<void()>> work;
};

namespace {

thread_local cudaError_t t_last_error = cudaSuccess;
// What the last refused copy or memset of this thread got wrong (cudaGetErrorString of
// cudaErrorInvalidValue returns it): the call, its pointers and what each is.
thread_local std::string t_invalid_value_detail;

bool is_device(const void* p, size_t bytes) { return cuda_emu::device::contains(p, bytes); }


cudaError_t set(cudaError_t e) {
  if (e != cudaSuccess) t_last_error = e;
  return e;
}

cudaError_t invalid_pointer(std::string detail) {
  t_invalid_value_detail = "invalid argument (emulation: " + detail + ")";
  return set(cudaErrorInvalidValue);
}
std::string pointer_text(const char* role, const void* p) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%p", p);
  return std::string(role) + " " + buf + " is " + cuda_emu::device::describe(p);
}

// Stream capture: the streams capturing now and what they recorded. Pinned host allocations
// (device_memory.h) are the only host memory a captured copy may touch: a pageable copy is refused,
// as CUDA refuses it.
struct Capture {
  CUgraph_st* graph;           // what the capture records into: its own new graph, or (cudaStreamBeginCaptureToGraph) one given
  bool into_given_graph;
  std::string invalidated_by;  // the first call refused during the capture
};
std::mutex g_capture_mu;
std::map<cudaStream_t, Capture> g_captures;
std::atomic<int64_t> g_graph_launches{0};

bool pinned(const void* p, size_t bytes) { return cuda_emu::device::is_pinned(p, bytes); }
// A call that may not happen while any stream captures (global capture mode: allocations, host
// waits, synchronous copies): the captures are invalidated and the call fails, as on a GPU.
thread_local bool t_in_host_function = false;  // a cudaLaunchHostFunc's function runs on this thread
bool refused_during_capture(const char* call) {
  if (t_in_host_function) {
    std::fprintf(stderr, "emulated CUDA: %s called inside a host function (cudaLaunchHostFunc forbids CUDA calls)\n", call);
    std::abort();
  }
  std::lock_guard<std::mutex> lock(g_capture_mu);
  if (g_captures.empty()) return false;
  for (auto& [stream, c] : g_captures)
    if (c.invalidated_by.empty()) c.invalidated_by = call;
  t_last_error = cudaErrorStreamCaptureUnsupported;
  return true;
}
bool capturing(cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(g_capture_mu);
  return g_captures.count(stream) > 0;
}

}  // namespace

bool cuda_emu::record_if_capturing(cudaStream_t stream, std::function<void()> work) {
  std::lock_guard<std::mutex> lock(g_capture_mu);
  auto it = g_captures.find(stream);
  if (it == g_captures.end()) return false;
  it->second.graph->work.push_back(std::move(work));
  return true;
}
int64_t cuda_emu::graph_launches() { return g_graph_launches.load(); }

namespace {
// Conditional handles (cudaGraphConditionalHandleCreate): handle h is entry h - 1. A kernel sets the
// value from any worker thread (cudaGraphSetConditional), the node reads it between body runs.
struct Conditional {
  std::atomic<unsigned> value{0};
  unsigned default_value = 0;
  bool assign_default = false;
};
std::mutex g_conditional_mu;
std::deque<Conditional> g_conditionals;
std::atomic<int64_t> g_conditional_bodies{0};
// A WHILE node whose condition nothing clears is an error, not a hang: no loop of the backend runs
// this many bodies (SWAN's runs ceil(ns_steps / 2)).
constexpr int64_t kMaxWhileBodies = 10000;

Conditional& conditional(cudaGraphConditionalHandle handle, const char* caller) {
  std::lock_guard<std::mutex> lock(g_conditional_mu);
  if (handle == 0 || handle > g_conditionals.size()) {
    std::fprintf(stderr, "emulated CUDA: %s with conditional handle %llu, which no cudaGraphConditionalHandleCreate made\n", caller,
                 static_cast<unsigned long long>(handle));
    std::abort();
  }
  return g_conditionals[handle - 1];
}
}  // namespace
int64_t cuda_emu::conditional_bodies() { return g_conditional_bodies.load(); }
// The same count for tests that reach the emulation only through the loaded plugin (dlsym).
extern "C" int64_t multinorm_emu_conditional_bodies(void) { return g_conditional_bodies.load(); }

void cudaGraphSetConditional(cudaGraphConditionalHandle handle, unsigned int value) {
  conditional(handle, "cudaGraphSetConditional").value = value;
}

namespace {
// The physical ids of the visible emulated devices (cuda_emulation.h).
const std::vector<int>& visible_ids() {
  static const std::vector<int> ids = [] {
    int n = 1;
    if (const char* e = std::getenv("MULTINORM_EMU_DEVICES"); e && *e) n = std::max(1, std::atoi(e));
    std::vector<int> v;
    const char* list = std::getenv("CUDA_VISIBLE_DEVICES");
    if (!list) {
      for (int i = 0; i < n; ++i) v.push_back(i);
      return v;
    }
    for (const char* p = list; *p;) {  // "2,3": the listed ids that exist, in order; the first bad one ends the list
      char* end = nullptr;
      const long id = std::strtol(p, &end, 10);
      if (end == p || id < 0 || id >= n) break;
      v.push_back(static_cast<int>(id));
      p = *end == ',' ? end + 1 : end;
      if (*end != ',' && *end) break;
    }
    return v;
  }();
  return ids;
}
thread_local int g_current_device = 0;  // per host thread, as the CUDA runtime keeps it
std::atomic<int> g_test_device_count{0};
}  // namespace
int cuda_emu::visible_devices() {
  const int n = g_test_device_count.load();
  return n > 0 ? n : static_cast<int>(visible_ids().size());
}
int cuda_emu::physical_device(int device) { return g_test_device_count.load() > 0 ? device : visible_ids().at(device); }
void cuda_emu::set_device_count_for_test(int n) {
  g_test_device_count = n;
  g_current_device = 0;
}

extern "C" {

cudaError_t cudaGetDeviceCount(int* count) {
  *count = cuda_emu::visible_devices();
  return *count > 0 ? cudaSuccess : set(cudaErrorNoDevice);
}
cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= cuda_emu::visible_devices()) return set(cudaErrorInvalidDevice);
  g_current_device = device;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  *device = g_current_device;
  return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int* v) {
  *v = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int* v) {
  *v = CUDART_VERSION;  // the emulated "driver" is as new as the headers
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (device < 0 || device >= cuda_emu::visible_devices()) return set(cudaErrorInvalidDevice);
  switch (attr) {
    // An A100's (SXM, sm_80): the smallest target, whose limits the emulation enforces (launch_limits.h).
    case cudaDevAttrMultiProcessorCount: *value = 108; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = 163 * 1024; break;
    case cudaDevAttrComputeCapabilityMajor: *value = 8; break;
    case cudaDevAttrComputeCapabilityMinor: *value = 0; break;
    default: *value = 0;
  }
  return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  // The emulated device has the machine's RAM.
  *total_bytes = cuda_emu::device::capacity();
  const size_t used = cuda_emu::device::bytes_in_use();
  *free_bytes = *total_bytes > used ? *total_bytes - used : 0;
  return cudaSuccess;
}
cudaError_t cudaMalloc(void** p, size_t bytes) {
  if (refused_during_capture("cudaMalloc")) return cudaErrorStreamCaptureUnsupported;
  // Guarded pages, poisoned with NaN: device_memory.h. A request larger than what is free fails as on a GPU.
  *p = cuda_emu::device::allocate(bytes);
  return *p ? cudaSuccess : set(cudaErrorMemoryAllocation);
}
cudaError_t cudaFree(void* p) {
  if (!p) return cudaSuccess;
  if (refused_during_capture("cudaFree")) return cudaErrorStreamCaptureUnsupported;
  return cuda_emu::device::release(p) ? cudaSuccess : set(cudaErrorInvalidValue);
}
cudaError_t cudaMallocHost(void** p, size_t bytes) {
  if (refused_during_capture("cudaMallocHost")) return cudaErrorStreamCaptureUnsupported;
  *p = std::malloc(bytes ? bytes : 1);
  if (!*p) return set(cudaErrorMemoryAllocation);
  cuda_emu::device::add_pinned(*p, bytes ? bytes : 1);
  return cudaSuccess;
}
cudaError_t cudaFreeHost(void* p) {
  if (!p) return cudaSuccess;
  if (refused_during_capture("cudaFreeHost")) return cudaErrorStreamCaptureUnsupported;
  cuda_emu::device::remove_pinned(p);
  std::free(p);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream) {
  if (bytes == 0) return cudaSuccess;
  const bool dst_dev = is_device(dst, bytes), src_dev = is_device(src, bytes);
  // Each side must be what the direction says, over all `bytes`: a device side inside one live
  // allocation, a host side outside every one.
  const char* names[] = {"HostToHost", "HostToDevice", "DeviceToHost", "DeviceToDevice", "Default"};
  bool want_dst = false, want_src = false;
  switch (kind) {
    case cudaMemcpyHostToDevice: want_dst = true; break;
    case cudaMemcpyDeviceToHost: want_src = true; break;
    case cudaMemcpyDeviceToDevice: want_dst = want_src = true; break;
    default:  // the backend always says which way a copy goes
      return invalid_pointer(std::string("cudaMemcpyAsync with kind ") + names[std::min<int>(kind, 4)] + ": the backend names the direction");
  }
  if (dst_dev != want_dst || src_dev != want_src) {
    const bool dst_bad = dst_dev != want_dst;
    const void* bad = dst_bad ? dst : src;
    return invalid_pointer(std::string("cudaMemcpyAsync ") + names[kind] + " of " + std::to_string(bytes) + " bytes: the " +
                           (dst_bad ? "destination" : "source") + " should be " +
                           ((dst_bad ? want_dst : want_src) ? "device memory holding all the bytes" : "host memory") + ", but " +
                           pointer_text(dst_bad ? "the destination" : "the source", bad));
  }
  if (capturing(stream)) {
    const void* host = kind == cudaMemcpyHostToDevice ? src : kind == cudaMemcpyDeviceToHost ? dst : nullptr;
    if (host && !pinned(host, bytes)) {  // a pageable copy is staged by the host at once: not capturable
      refused_during_capture("cudaMemcpyAsync from or to pageable host memory");
      return cudaErrorStreamCaptureUnsupported;
    }
    cuda_emu::record_if_capturing(stream, [=] { std::memmove(dst, src, bytes); });
    return cudaSuccess;
  }
  std::memmove(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  if (refused_during_capture("cudaMemcpy")) return cudaErrorStreamCaptureUnsupported;
  return cudaMemcpyAsync(dst, src, bytes, kind, nullptr);
}
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t stream) {
  if (bytes && !is_device(p, bytes))
    return invalid_pointer("cudaMemsetAsync of " + std::to_string(bytes) + " bytes: " + pointer_text("the destination", p) +
                           ", not device memory holding all the bytes");
  if (cuda_emu::record_if_capturing(stream, [=] { std::memset(p, value, bytes); })) return cudaSuccess;
  std::memset(p, value, bytes);
  return cudaSuccess;
}
cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode) {
  std::lock_guard<std::mutex> lock(g_capture_mu);
  if (g_captures.count(stream)) return set(cudaErrorIllegalState);
  g_captures[stream] = Capture{new CUgraph_st, false, {}};
  return cudaSuccess;
}
cudaError_t cudaStreamBeginCaptureToGraph(cudaStream_t stream, cudaGraph_t graph, const cudaGraphNode_t*, const cudaGraphEdgeData*, size_t,
                                          cudaStreamCaptureMode) {
  std::lock_guard<std::mutex> lock(g_capture_mu);
  if (!graph) return set(cudaErrorInvalidValue);
  if (g_captures.count(stream)) return set(cudaErrorIllegalState);
  g_captures[stream] = Capture{graph, true, {}};
  return cudaSuccess;
}
// The capture's graph; no dependencies (the emulation runs a stream's work in order).
cudaError_t cudaStreamGetCaptureInfo(cudaStream_t stream, cudaStreamCaptureStatus* status, unsigned long long* id, cudaGraph_t* graph,
                                     const cudaGraphNode_t** dependencies, const cudaGraphEdgeData** edges, size_t* count) {
  std::lock_guard<std::mutex> lock(g_capture_mu);
  auto it = g_captures.find(stream);
  if (status) *status = it == g_captures.end() ? cudaStreamCaptureStatusNone : cudaStreamCaptureStatusActive;
  if (id) *id = 0;
  if (graph) *graph = it == g_captures.end() ? nullptr : it->second.graph;
  if (dependencies) *dependencies = nullptr;
  if (edges) *edges = nullptr;
  if (count) *count = 0;
  return cudaSuccess;
}
cudaError_t cudaStreamUpdateCaptureDependencies(cudaStream_t stream, cudaGraphNode_t*, const cudaGraphEdgeData*, size_t, unsigned int) {
  return capturing(stream) ? cudaSuccess : set(cudaErrorIllegalState);
}
cudaError_t cudaGraphConditionalHandleCreate(cudaGraphConditionalHandle* handle, cudaGraph_t graph, unsigned int default_value, unsigned int flags) {
  if (!graph || !handle) return set(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lock(g_conditional_mu);
  Conditional& c = g_conditionals.emplace_back();
  c.default_value = default_value;
  c.assign_default = (flags & cudaGraphCondAssignDefault) != 0;
  *handle = g_conditionals.size();
  return cudaSuccess;
}
// Only what the backend adds by hand: a WHILE node, recorded as the work that runs its body while the
// handle's value is non-zero. CUDA assigns the default (when asked) at each launch of the graph; the
// node runs once per launch, so the emulation assigns it as the node starts. Anything else is refused.
cudaError_t cudaGraphAddNode(cudaGraphNode_t* node, cudaGraph_t graph, const cudaGraphNode_t*, const cudaGraphEdgeData*, size_t,
                             cudaGraphNodeParams* params) {
  if (!graph || !node || !params || params->type != cudaGraphNodeTypeConditional || params->conditional.type != cudaGraphCondTypeWhile ||
      params->conditional.size != 1)
    return set(cudaErrorNotSupported);
  if (const char* e = std::getenv("MULTINORM_EMU_REFUSE_WHILE"); e && *e == '1') return set(cudaErrorNotSupported);  // a driver without them
  const cudaGraphConditionalHandle handle = params->conditional.handle;
  conditional(handle, "cudaGraphAddNode");
  auto owned = std::make_unique<CUgraphNode_st>();
  owned->body = std::make_shared<CUgraph_st>();
  owned->body_handle[0] = owned->body.get();
  params->conditional.phGraph_out = owned->body_handle;
  std::shared_ptr<CUgraph_st> body = owned->body;
  graph->work.push_back([body, handle] {
    Conditional& c = conditional(handle, "a WHILE node");
    if (c.assign_default) c.value = c.default_value;
    for (int64_t runs = 0; c.value != 0; ++runs) {
      if (runs == kMaxWhileBodies)
        throw std::runtime_error("emulated CUDA: a WHILE node ran its body " + std::to_string(runs) +
                                 " times: nothing cleared its condition (cudaGraphSetConditional)");
      ++g_conditional_bodies;
      for (const auto& work : body->work) work();
    }
  });
  *node = owned.get();
  graph->nodes.push_back(std::move(owned));
  return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  std::lock_guard<std::mutex> lock(g_capture_mu);
  auto it = g_captures.find(stream);
  if (it == g_captures.end()) return set(cudaErrorIllegalState);
  Capture c = std::move(it->second);
  g_captures.erase(it);
  *graph = nullptr;
  if (!c.invalidated_by.empty()) {
    std::fprintf(stderr, "cuda emulation: the capture was invalidated by %s\n", c.invalidated_by.c_str());
    if (!c.into_given_graph) delete c.graph;
    return set(cudaErrorStreamCaptureInvalidated);
  }
  *graph = c.graph;
  return cudaSuccess;
}
cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  *status = capturing(stream) ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
  return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  if (!graph) return set(cudaErrorInvalidValue);
  *exec = new CUgraphExec_st{graph->work};
  return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  if (!exec) return set(cudaErrorInvalidValue);
  if (capturing(stream)) return set(cudaErrorStreamCaptureUnsupported);  // nested graphs are not used here
  ++g_graph_launches;
  for (const auto& work : exec->work) work();  // a kernel's error propagates as at an eager launch
  return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete graph;
  return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete exec;
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) {
  *s = reinterpret_cast<cudaStream_t>(new char(0));
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  delete reinterpret_cast<char*>(s);
  return cudaSuccess;
}
// A host function in stream order (a host node when captured). CUDA forbids CUDA calls inside one:
// the synchronising and allocating calls end the process here while one runs.
cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* data) {
  auto run = [fn, data] {
    t_in_host_function = true;
    fn(data);
    t_in_host_function = false;
  };
  if (!cuda_emu::record_if_capturing(stream, run)) run();
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) {
  return refused_during_capture("cudaStreamSynchronize") ? cudaErrorStreamCaptureUnsupported : cudaSuccess;
}
// Events: work is done when it is issued here, so an event is complete once recorded; it keeps the
// host's clock at recording, which is when the (synchronous) work before it ended.
struct EmulatedEvent {
  bool recorded = false;
  bool timing = true;
  std::chrono::steady_clock::time_point at;
};
static EmulatedEvent* event_of(cudaEvent_t e) { return reinterpret_cast<EmulatedEvent*>(e); }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags) {
  auto* ev = new EmulatedEvent;
  ev->timing = !(flags & cudaEventDisableTiming);
  *e = reinterpret_cast<cudaEvent_t>(ev);
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete event_of(e);
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t stream) {
  if (!e) return set(cudaErrorInvalidValue);
  // An event inside a capture would be a graph node; this backend never records one there.
  if (capturing(stream)) {
    refused_during_capture("cudaEventRecord");
    return cudaErrorStreamCaptureUnsupported;
  }
  event_of(e)->recorded = true;
  event_of(e)->at = std::chrono::steady_clock::now();
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t e) { return e ? cudaSuccess : set(cudaErrorInvalidValue); }
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  if (refused_during_capture("cudaEventSynchronize")) return cudaErrorStreamCaptureUnsupported;
  return e ? cudaSuccess : set(cudaErrorInvalidValue);
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t stop) {
  if (!start || !stop || !event_of(start)->recorded || !event_of(stop)->recorded) return set(cudaErrorInvalidResourceHandle);
  if (!event_of(start)->timing || !event_of(stop)->timing) return set(cudaErrorInvalidResourceHandle);
  *ms = std::chrono::duration<float, std::milli>(event_of(stop)->at - event_of(start)->at).count();
  return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t e, unsigned) {
  // Waiting on an event never recorded is legal CUDA (a no-op) but always a bug in this backend.
  return e && event_of(e)->recorded ? cudaSuccess : set(cudaErrorInvalidValue);
}
cudaError_t cudaDeviceSynchronize(void) {
  return refused_during_capture("cudaDeviceSynchronize") ? cudaErrorStreamCaptureUnsupported : cudaSuccess;
}
cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) return set(cuda_emu::limits::set_max_dynamic_shared(func, value));
  return cudaSuccess;  // the others (carve-out, cluster shapes) are hints the emulation has no use for
}
cudaError_t cudaGetLastError(void) {
  const cudaError_t e = t_last_error;
  t_last_error = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError(void) { return t_last_error; }
const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorIllegalState: return "cudaErrorIllegalState";
    default: return "cudaError";
  }
}
const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue:
      return t_invalid_value_detail.empty() ? "invalid argument (emulation: a pointer is not in emulated device memory, or a copy goes the wrong way)"
                                            : t_invalid_value_detail.c_str();
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    case cudaErrorIllegalState: return "operation not permitted in the current state (a stream already capturing, or not capturing)";
    default: return "emulated CUDA error";
  }
}

}  // extern "C"
