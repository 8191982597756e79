// Helpers of the tests that launch kernels on the emulated CUDA build directly (cuda_emulation_tests):
// a device array with its host copy, and the message of a failed launch.
#pragma once
#include <string>
#include <vector>

#include "../kernels/cuda/cuda_compat.h"
#include "multinorm/error.h"

namespace emulated {

template <class T>
struct DeviceArray {
  T* p = nullptr;
  size_t n;
  explicit DeviceArray(const std::vector<T>& h) : n(h.size()) {
    cudaMalloc(reinterpret_cast<void**>(&p), n * sizeof(T));
    cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice);
  }
  explicit DeviceArray(size_t count, T fill = T{}) : DeviceArray(std::vector<T>(count, fill)) {}
  ~DeviceArray() { cudaFree(p); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  std::vector<T> get() const {
    std::vector<T> h(n);
    cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost);
    return h;
  }
};

// The message of the multinorm::Error fn() throws ("" if it throws none).
template <class Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const multinorm::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace emulated
