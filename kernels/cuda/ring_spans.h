// Spans of a ring buffer handed out in order and given back oldest first: the bookkeeping of the
// pinned staging rings in check.cu (device-to-host copies, freed as they are delivered; host-to-device
// uploads, freed as their copies complete). Plain C++: tested on its own (tests/test_cuda_emulation.cpp).
#pragma once
#include <cstdint>
#include <deque>
#include <utility>

namespace multinorm::cuda {

class RingSpans {
 public:
  explicit RingSpans(int64_t capacity) : capacity_(capacity) {}
  // The start of `bytes` free bytes after the newest span, wrapping to 0 when they do not fit before
  // the end; -1 while the spans still held hold that room (give the oldest back, then ask again).
  int64_t take(int64_t bytes) {
    if (bytes <= 0 || bytes > capacity_) return -1;
    int64_t begin = -1;
    if (spans_.empty()) {
      begin = 0;
    } else {
      const int64_t head = spans_.back().second, tail = spans_.front().first;
      // Wrapped: the newest span starts before the oldest, so the free room is [head, tail).
      const bool wrapped = spans_.back().first < spans_.front().first;
      if (wrapped) {
        if (head + bytes <= tail) begin = head;
      } else if (head + bytes <= capacity_) {
        begin = head;
      } else if (bytes <= tail) {
        begin = 0;
      }
    }
    if (begin >= 0) spans_.emplace_back(begin, begin + bytes);
    return begin;
  }
  void give_back_oldest() { spans_.pop_front(); }
  bool empty() const { return spans_.empty(); }
  int64_t held() const { return static_cast<int64_t>(spans_.size()); }
  int64_t capacity() const { return capacity_; }

 private:
  int64_t capacity_;
  std::deque<std::pair<int64_t, int64_t>> spans_;  // [begin, end), oldest first
};

}  // namespace multinorm::cuda
