// The CUDA backend's growable device buffers, shared by the backend and its optimizer kernels:
// Scratch (device memory grown to the largest request), SwanStaging (SWAN's pinned exact-path
// staging) and DescriptorCache (multi-tensor launches' descriptor tables, uploaded once).
#pragma once
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "check.h"
#include "cuda_queue.h"
#include "kernels.h"
#include "multinorm/cuda_scratch.h"
#include "multinorm/error.h"

namespace multinorm::cuda {

// A device buffer that grows on first use of a larger size and is reused after (no allocation on the
// hot path once every shape has been seen). A move is told to the queue: a graph captured before it
// holds the old address and is not replayed (CudaQueue::replay).
class Scratch {
 public:
  explicit Scratch(CudaQueue& q) : q_(q) {}
  ~Scratch() { cudaFree(ptr_); }
  void* get(size_t bytes, const char* what) {
    if (bytes > bytes_) {
      MN_CUDA_CHECK(cudaFree(ptr_), what);
      ptr_ = nullptr;
      bytes_ = 0;
      const cudaError_t e = cudaMalloc(&ptr_, bytes);
      if (e != cudaSuccess) {
        cudaGetLastError();
        throw_cuda_error(std::string("cudaMalloc of ") + std::to_string(bytes) + " bytes of scratch for " + what, e);
      }
      bytes_ = bytes;
      q_.note_buffers_moved();
    }
    return ptr_;
  }
  size_t bytes() const { return bytes_; }

 private:
  CudaQueue& q_;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// SWAN's exact-path staging: pinned host memory that kernels write and host functions read (UVA:
// one address for both), grown like Scratch, and the host functions' group descriptions by shapes,
// which a captured graph holds (dropped with the memory they point into).
class SwanStaging {
 public:
  explicit SwanStaging(CudaQueue& q) : q_(q) {}
  ~SwanStaging() {
    jobs_.clear();
    cudaFreeHost(ptr_);
  }
  void reserve(size_t bytes) {
    if (bytes <= bytes_) return;
    jobs_.clear();
    MN_CUDA_CHECK(cudaFreeHost(ptr_), "swan's pinned staging");
    ptr_ = nullptr;
    bytes_ = 0;
    MN_CUDA_CHECK(cudaMallocHost(&ptr_, bytes), "pinned staging of " + std::to_string(bytes) + " bytes for swan's exact path");
    bytes_ = bytes;
    q_.note_buffers_moved();
  }
  // An exact-path group of these shapes (cuda_scratch::swan_exact_groups), staged from the start.
  cuda::SwanExactGroup* group(const std::vector<std::pair<int64_t, int64_t>>& shapes) {
    auto& g = jobs_[shapes];
    if (!g) g.reset(cuda::swan_exact_group(ptr_, shapes));
    return g.get();
  }

 private:
  CudaQueue& q_;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  struct Free {
    void operator()(cuda::SwanExactGroup* g) const { cuda::swan_exact_group_free(g); }
  };
  std::map<std::vector<std::pair<int64_t, int64_t>>, std::unique_ptr<cuda::SwanExactGroup, Free>> jobs_;
};

// Device copies of the multi-tensor launches' descriptor tables, found by their bytes. An optimizer
// update passes the same tables every time (the same tensors, the same scratch), so each is uploaded
// once; a graph captured later finds its tables on the device (an upload from pageable memory cannot
// be captured), and nothing rewrites them while the graph may read them. When the buffer
// (cuda_scratch::kDescriptorCacheBytes) is full it starts over in place: the new uploads are
// stream-ordered after every launch that read the old tables, and the queue is told (a graph holding
// them is not replayed).
class DescriptorCache {
 public:
  explicit DescriptorCache(CudaQueue& q) : q_(q) {}
  ~DescriptorCache() { cudaFree(base_); }
  const void* get(const void* table, size_t bytes, const char* what) {
    const char* p = static_cast<const char*>(table);
    uint64_t h = 1469598103934665603ull;  // FNV-1a
    for (size_t i = 0; i < bytes; ++i) h = (h ^ static_cast<uint8_t>(p[i])) * 1099511628211ull;
    const auto found = index_.equal_range(h);
    for (auto it = found.first; it != found.second; ++it)
      if (it->second.bytes == bytes && std::memcmp(shadow_.data() + it->second.offset, p, bytes) == 0) return base_ + it->second.offset;
    if (q_.capturing())
      throw Error(std::string(what) + ": its descriptor table is not on the device, and the stream is capturing a graph (an upload from pageable "
                                      "memory cannot be captured: the ops must run once eagerly before their capture)");
    constexpr size_t kCapacity = static_cast<size_t>(cuda_scratch::kDescriptorCacheBytes);
    if (bytes > kCapacity) throw Error(std::string(what) + ": a descriptor table of " + std::to_string(bytes) + " bytes exceeds the cache");
    if (!base_) {
      void* b = nullptr;
      const cudaError_t e = cudaMalloc(&b, kCapacity);
      if (e != cudaSuccess) {
        cudaGetLastError();
        throw_cuda_error(std::string("cudaMalloc of the descriptor cache for ") + what, e);
      }
      base_ = static_cast<char*>(b);
      shadow_.resize(kCapacity);
    }
    size_t offset = (used_ + 255) / 256 * 256;
    if (offset + bytes > kCapacity) {  // start over in place (see above)
      index_.clear();
      offset = 0;
      q_.note_buffers_moved();
    }
    q_.upload(base_ + offset, table, static_cast<int64_t>(bytes), std::string(what) + " (descriptors)");
    std::memcpy(shadow_.data() + offset, p, bytes);
    index_.emplace(h, Entry{offset, bytes});
    used_ = offset + bytes;
    return base_ + offset;
  }
  size_t bytes() const { return base_ ? static_cast<size_t>(cuda_scratch::kDescriptorCacheBytes) : 0; }

 private:
  struct Entry {
    size_t offset, bytes;
  };
  CudaQueue& q_;
  char* base_ = nullptr;
  std::vector<char> shadow_;  // the device bytes, to compare with
  std::unordered_multimap<uint64_t, Entry> index_;
  size_t used_ = 0;
};

}  // namespace multinorm::cuda
