// Eager runs, capture and replay of a sequence of ops (include/multinorm/graph_cache.h).
#include "multinorm/graph_cache.h"

namespace multinorm {

GraphCache::~GraphCache() {
  if (graph_ >= 0) queue_.release_graph(graph_);
}

void GraphCache::set_enabled(bool on) {
  enabled_ = on;
  if (!on) drop();
}

void GraphCache::drop() {
  if (graph_ < 0) return;
  queue_.release_graph(graph_);
  graph_ = -1;
  if (uses_of_graph_ <= 1 && ++one_use_graphs_ >= kMaxWasted)
    gave_up_ = std::to_string(one_use_graphs_) + " graphs were used only once (the key changed every run: a loss scale that changes every update)";
  uses_of_graph_ = 0;
}

// Captures the ops and runs the graph once. False when the capture failed (abandoned: nothing ran).
bool GraphCache::capture(const std::function<void()>& ops) {
  try {
    ops();
    graph_ = queue_.end_capture();
  } catch (const Error& e) {
    queue_.abandon_capture();
    settled_at_ = -1;
    if (++failed_captures_ >= kMaxWasted) gave_up_ = std::string("captures failed: ") + e.what();
    return false;
  } catch (...) {
    queue_.abandon_capture();
    throw;
  }
  ++captures_;
  if (!queue_.replay(graph_)) throw Error("a graph just captured could not be replayed");  // capturing ran nothing
  ++replays_;
  uses_of_graph_ = 1;
  return true;
}

void GraphCache::run(const std::string& key, const std::function<void()>& ops) {
  if (!enabled_ || !gave_up_.empty()) return ops();
  if (key != key_) {
    drop();
    key_ = key;
    settled_at_ = -1;
  }
  if (graph_ >= 0) {
    if (queue_.replay(graph_)) {
      ++replays_;
      ++uses_of_graph_;
      return;
    }
    drop();  // a buffer it holds moved, or the queue is profiling: eagerly, captured again later
  }
  const int64_t before = queue_.buffer_moves();
  if (settled_at_ == before && gave_up_.empty() && queue_.begin_capture() && capture(ops)) return;
  ops();
  settled_at_ = queue_.buffer_moves() == before ? before : -1;
}

}  // namespace multinorm
