// One mechanism for running a sequence of ops eagerly or from a captured graph (CUDA graphs), used by
// the model's micro-batch and by the optimizer's update. For a key (what makes two sequences the
// same: a shape, a loss scale), run(key, ops):
//   - runs the ops eagerly until one eager run of that key moved no buffer a graph could hold
//     (WorkQueue::buffer_moves: scratch grows on the first runs of a shape);
//   - then captures them and replays the graph from then on: one launch instead of hundreds;
//   - drops the graph when a buffer it holds moved (it runs eagerly and is captured again) or the
//     key changed (the new key starts over);
//   - gives graphs up, saying why, after two graphs used once each (a key changing every time: a
//     loss scale that changes every update) or two failed captures (ops that cannot be captured).
// A failed capture is abandoned and its ops run eagerly. On a queue without graphs (the CPU) the
// ops always run eagerly.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include "multinorm/work_queue.h"

namespace multinorm {

class GraphCache {
 public:
  explicit GraphCache(WorkQueue& queue) : queue_(queue) {}
  ~GraphCache();
  GraphCache(const GraphCache&) = delete;
  GraphCache& operator=(const GraphCache&) = delete;

  void set_enabled(bool on);
  void run(const std::string& key, const std::function<void()>& ops);

  int64_t captures() const { return captures_; }
  int64_t replays() const { return replays_; }
  // Why this cache stopped capturing ("" while it captures, or never tried).
  const std::string& gave_up() const { return gave_up_; }

 private:
  static constexpr int kMaxWasted = 2;  // one-use graphs, or failed captures, before giving up
  void drop();
  bool capture(const std::function<void()>& ops);
  WorkQueue& queue_;
  bool enabled_ = false;
  std::string key_;
  int64_t graph_ = -1, uses_of_graph_ = 0;
  int64_t settled_at_ = -1;  // buffer_moves() after an eager run of key_ that moved nothing; -1: none
  int64_t captures_ = 0, replays_ = 0, one_use_graphs_ = 0, failed_captures_ = 0;
  std::string gave_up_;
};

}  // namespace multinorm
