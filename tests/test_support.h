// Test support for backend ops: random data, buffers moved through the Backend seam, finite
// differences in FP64 and a tolerance check that reports the worst element.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "../kernels/common/bf16.h"
#include "multinorm/backend.h"

namespace multinorm::testing {

using Vec = std::vector<double>;

inline Vec random_vec(size_t n, uint32_t seed, double scale = 1.0) {
  std::mt19937 gen(seed);
  std::normal_distribution<double> dist(0.0, scale);
  Vec v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

// A backend buffer holding `values` in `dtype`, released with the object.
class DeviceBuffer {
 public:
  DeviceBuffer(Backend& be, const Vec& values, DType dtype) : be_(be), n_(values.size()), dtype_(dtype) {
    ptr_ = be_.allocate(static_cast<int64_t>(n_) * dtype_bytes(dtype));
    set(values);
  }
  DeviceBuffer(Backend& be, size_t n, DType dtype) : DeviceBuffer(be, Vec(n, 0.0), dtype) {}
  ~DeviceBuffer() { be_.release(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  Buf buf() const { return {ptr_, dtype_}; }
  float* f32() const { return static_cast<float*>(ptr_); }
  void set(const Vec& values) {
    if (dtype_ == DType::F32) {
      std::vector<float> f(values.begin(), values.end());
      be_.to_device(ptr_, f.data(), static_cast<int64_t>(n_) * 4);
    } else {
      std::vector<bf16> h(n_);
      for (size_t i = 0; i < n_; ++i) h[i] = to_bf16(static_cast<float>(values[i]));
      be_.to_device(ptr_, h.data(), static_cast<int64_t>(n_) * 2);
    }
  }
  Vec get() const {
    Vec out(n_);
    if (dtype_ == DType::F32) {
      std::vector<float> f(n_);
      be_.to_host(f.data(), ptr_, static_cast<int64_t>(n_) * 4);
      for (size_t i = 0; i < n_; ++i) out[i] = f[i];
    } else {
      std::vector<bf16> h(n_);
      be_.to_host(h.data(), ptr_, static_cast<int64_t>(n_) * 2);
      for (size_t i = 0; i < n_; ++i) out[i] = to_f32(h[i]);
    }
    return out;
  }

 private:
  Backend& be_;
  size_t n_;
  DType dtype_;
  void* ptr_;
};

// Central differences of f at x, FP64.
inline Vec numeric_grad(const std::function<double(const Vec&)>& f, Vec x, double h = 1e-5) {
  Vec g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double keep = x[i];
    x[i] = keep + h;
    const double up = f(x);
    x[i] = keep - h;
    const double down = f(x);
    x[i] = keep;
    g[i] = (up - down) / (2 * h);
  }
  return g;
}

// max_i |actual - expected| <= rtol * max_i |expected| + atol, reporting the worst element.
inline ::testing::AssertionResult close(const Vec& actual, const Vec& expected, double rtol, double atol = 0.0) {
  if (actual.size() != expected.size())
    return ::testing::AssertionFailure() << "sizes differ: " << actual.size() << " vs " << expected.size();
  double scale = 0, worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < expected.size(); ++i) scale = std::max(scale, std::fabs(expected[i]));
  for (size_t i = 0; i < expected.size(); ++i) {
    const double e = std::fabs(actual[i] - expected[i]);
    if (!(e <= worst)) worst = e, at = i;
  }
  // MULTINORM_TEST_ERRORS=1 prints every comparison's measured error, to set tolerances from.
  if (std::getenv("MULTINORM_TEST_ERRORS"))
    std::printf("[ measured ] %s: max error %.3g of scale %.3g = %.3g relative (bound %.3g)\n",
                ::testing::UnitTest::GetInstance()->current_test_info()->name(), worst, scale,
                scale > 0 ? worst / scale : worst, rtol);
  if (worst <= rtol * scale + atol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "max error " << worst << " at " << at << " (actual " << actual[at]
                                       << ", expected " << expected[at] << "), bound " << rtol * scale + atol
                                       << " (scale " << scale << ")";
}

inline double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

}  // namespace multinorm::testing
