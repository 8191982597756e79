// What the kernel benchmarks (`bench attention`, `bench gemm`) share: operands of normal draws in a
// backend's memory, and timing its calls (a device backend's launches return before they run, so
// every window ends with a fence waited for).
#pragma once
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "multinorm/backend.h"

namespace multinorm::bench_kernels {

using Clock = std::chrono::steady_clock;

// The inputs: a block of N(0, 1) draws, uploaded once as FP32 and converted into dst tile by tile
// (the host never writes device memory directly). Drawing every element with
// std::normal_distribution took seconds a shape at 16k tokens of width 2048 (134M draws on one core).
constexpr int64_t kFillBlock = int64_t{1} << 20;
inline void fill_normal(Backend& be, Buf dst, int64_t n, uint32_t seed) {
  const int64_t m = std::min(n, kFillBlock);
  std::vector<float> host(static_cast<size_t>(m));
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (float& x : host) x = d(gen);
  void* staging = be.allocate(m * 4);
  be.to_device(staging, host.data(), m * 4);
  for (int64_t at = 0; at < n; at += m) be.convert(dst.at(at), Buf{staging, DType::F32}, std::min(m, n - at));
  be.queue().wait_all();
  be.release(staging);
}

inline double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// One call of fn, waited for (a device backend's launches return before they run): its seconds.
inline double one_call(Backend& be, const std::function<void()>& fn) {
  WorkQueue& q = be.queue();
  q.wait_all();
  const auto t0 = Clock::now();
  fn();
  q.wait(q.fence());
  return since(t0);
}

// Untimed calls until both at least `calls` ran and at least `seconds` passed; how many ran.
inline int64_t warm_up(Backend& be, int64_t calls, double seconds, const std::function<void()>& fn) {
  const auto t0 = Clock::now();
  int64_t n = 0;
  while (n < calls || since(t0) < seconds) one_call(be, fn), ++n;
  return n;
}

// Seconds per call of fn over a window of calls queued back to back (the queue drained before, a
// fence after the last call waited for) of at least min_calls and at least min_seconds, so a window
// of short kernels is not a few launches' latency: sized from one call timed alone, and timed again,
// longer, while it comes out short.
inline double seconds_per_call(Backend& be, int64_t min_calls, double min_seconds, const std::function<void()>& fn, int64_t& calls) {
  constexpr int64_t kMaxCalls = 100000;
  const double single = one_call(be, fn);
  calls = std::min<int64_t>(kMaxCalls, std::max<int64_t>(min_calls, static_cast<int64_t>(std::ceil(min_seconds / std::max(single, 1e-7)))));
  WorkQueue& q = be.queue();
  for (;;) {
    q.wait_all();
    const auto t0 = Clock::now();
    for (int64_t i = 0; i < calls; ++i) fn();
    q.wait(q.fence());
    const double window = since(t0);
    if (window >= min_seconds || calls >= kMaxCalls) return window / static_cast<double>(calls);
    calls = std::min<int64_t>(kMaxCalls, std::max<int64_t>(calls + 1, static_cast<int64_t>(std::ceil(1.2 * calls * min_seconds / std::max(window, 1e-9)))));
  }
}

}  // namespace multinorm::bench_kernels
