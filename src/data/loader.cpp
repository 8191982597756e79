#include "multinorm/loader.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <numeric>
#include <random>

#include "multinorm/error.h"

namespace multinorm {

LoaderCursor LoaderCursor::from_json(const json& j) {
  LoaderCursor c;
  c.epoch = j.at("epoch").get<int64_t>();
  c.window = j.at("window").get<int64_t>();
  c.position = j.at("position").get<int64_t>();
  return c;
}

// ---------------------------------------------------------------------------------------------
// ShardSet
// ---------------------------------------------------------------------------------------------

ShardSet::ShardSet(const std::vector<std::string>& paths, int64_t seq_len, int64_t vocab_size) : T_(seq_len) {
  if (paths.empty()) throw Error("data: no shards");
  verified_.reset(new std::once_flag[paths.size()]);
  for (const auto& p : paths) {
    shards_.emplace_back(p, false);
    const ShardHeader& h = shards_.back().header();
    // A model may round its vocabulary up (llm.c pads GPT-2's 50257 to 50304): only fewer
    // embeddings than the tokenizer's pieces is an error.
    if (static_cast<int64_t>(h.vocab_size) > vocab_size)
      throw Error(p + ": tokenized with a vocabulary of " + std::to_string(h.vocab_size) + ", the model has only " +
                  std::to_string(vocab_size) + " embeddings (model.config.vocab_size must be at least the tokenizer's)");
    if (h.layout != shards_.front().header().layout)
      throw Error(p + ": layout " + layout_name(h.layout) + " differs from " + shards_.front().path());
  }
  const ShardHeader& h = shards_.front().header();
  filler_ = h.pad_id >= 0 ? h.pad_id : std::max(h.eos_id, 0);
}

void ShardSet::ensure_verified(int64_t s) const {
  std::call_once(verified_[s], [&] {  // an exception leaves the flag unset: the next touch retries
    const Shard& sh = shards_[s];
    if (!sh.verification_recorded()) sh.verify();
  });
}

int64_t ShardSet::sequences(int64_t s) const {
  const ShardHeader& h = shards_[s].header();
  if (h.layout == ShardLayout::Rows) return static_cast<int64_t>(h.num_docs);
  return h.num_tokens > 1 ? static_cast<int64_t>((h.num_tokens - 1) / T_) : 0;
}

int64_t ShardSet::total_sequences() const {
  int64_t n = 0;
  for (int64_t s = 0; s < shards(); ++s) n += sequences(s);
  return n;
}

int64_t ShardSet::targets(int64_t s, int64_t i) const {
  const Shard& sh = shards_[s];
  if (sh.header().layout == ShardLayout::Stream) return T_;
  return std::max<int64_t>(std::min<int64_t>(sh.row_length(i), T_) - 1, 0);
}

int64_t ShardSet::fill(int64_t s, int64_t i, Batch& b, int64_t slot) const {
  const Shard& sh = shards_[s];
  int32_t* x = b.tokens.data() + slot * T_;
  int32_t* y = b.targets.data() + slot * T_;
  uint8_t* m = b.mask.data() + slot * T_;
  if (sh.header().layout == ShardLayout::Stream) {
    const uint64_t start = static_cast<uint64_t>(i) * T_;
    for (int64_t t = 0; t < T_; ++t) {
      x[t] = static_cast<int32_t>(sh.token(start + t));
      y[t] = static_cast<int32_t>(sh.token(start + t + 1));
      m[t] = 1;
    }
    return T_;
  }
  const uint64_t start = sh.row_start(i);
  const int64_t len = std::min<int64_t>(sh.row_length(i), T_);
  for (int64_t t = 0; t < T_; ++t) {
    x[t] = t < len ? static_cast<int32_t>(sh.token(start + t)) : filler_;
    const bool counted = t + 1 < len;
    y[t] = counted ? static_cast<int32_t>(sh.token(start + t + 1)) : filler_;
    m[t] = counted ? 1 : 0;
  }
  return std::max<int64_t>(len - 1, 0);
}

// ---------------------------------------------------------------------------------------------
// Training order
// ---------------------------------------------------------------------------------------------

namespace {

uint64_t mix(uint64_t a, uint64_t b, uint64_t c) {
  std::seed_seq seq{static_cast<uint32_t>(a), static_cast<uint32_t>(a >> 32), static_cast<uint32_t>(b),
                    static_cast<uint32_t>(b >> 32), static_cast<uint32_t>(c), static_cast<uint32_t>(c >> 32)};
  uint32_t out[2];
  seq.generate(out, out + 2);
  return (static_cast<uint64_t>(out[0]) << 32) | out[1];
}

// Fisher-Yates with a 64-bit Mersenne Twister: the same permutation on every platform (std::shuffle
// is implementation-defined).
template <class V>
void permute(V& v, uint64_t seed) {
  std::mt19937_64 gen(seed);
  for (size_t i = v.size(); i > 1; --i) {
    const size_t j = static_cast<size_t>(gen() % i);
    std::swap(v[i - 1], v[j]);
  }
}

int64_t window_count(const ShardSet& d, const LoaderOptions& o) {
  const int64_t w = std::max<int64_t>(o.shuffle_window, 1);
  return (d.shards() + w - 1) / w;
}

void build_window(const ShardSet& d, const LoaderOptions& o, int64_t epoch, int64_t window, WindowOrder& win) {
  if (win.epoch == epoch && win.window == window) return;
  win.epoch = epoch;
  win.window = window;
  win.seqs.clear();
  std::vector<int32_t> order(d.shards());
  std::iota(order.begin(), order.end(), 0);
  if (o.shuffle) permute(order, mix(o.seed, static_cast<uint64_t>(epoch), 0x5ead5ULL));
  const int64_t w = std::max<int64_t>(o.shuffle_window, 1);
  for (int64_t k = window * w; k < std::min<int64_t>(d.shards(), (window + 1) * w); ++k) {
    d.ensure_verified(order[k]);  // first touch of this shard's data
    for (int64_t i = 0; i < d.sequences(order[k]); ++i) win.seqs.push_back({order[k], i});
  }
  if (o.shuffle) permute(win.seqs, mix(o.seed, static_cast<uint64_t>(epoch), 0x10000ULL + static_cast<uint64_t>(window)));
}

}  // namespace

Batch TrainLoader::make_batch(const ShardSet& d, const LoaderOptions& o, LoaderCursor& c, WindowOrder& win) {
  if (d.total_sequences() == 0) throw Error("data: the training shards hold no sequence of the run's length");
  const int64_t B = o.micro_batch, T = d.seq_len(), step = B * o.world;
  Batch b;
  b.B = B;
  b.T = T;
  b.tokens.resize(B * T);
  b.targets.resize(B * T);
  b.mask.resize(B * T);
  // Walk the global order for this step's B * world sequences; keep this rank's block of B.
  build_window(d, o, c.epoch, c.window, win);
  for (int64_t k = 0; k < step; ++k) {
    while (c.position >= static_cast<int64_t>(win.seqs.size())) {
      c.position = 0;
      if (++c.window >= window_count(d, o)) c.window = 0, ++c.epoch;
      build_window(d, o, c.epoch, c.window, win);
    }
    const auto [shard, index] = win.seqs[c.position++];
    if (k / B == o.rank) b.count += d.fill(shard, index, b, k % B);
    b.global_count += d.targets(shard, index);
  }
  b.after = c;
  return b;
}

TrainLoader::TrainLoader(std::shared_ptr<const ShardSet> data, const LoaderOptions& o, const LoaderCursor& start)
    : data_(std::move(data)), o_(o), cursor_(start) {
  if (o.rank < 0 || o.rank >= o.world) throw Error("data: rank " + std::to_string(o.rank) + " of " + std::to_string(o.world));
  // A cursor from a checkpoint must point into this data: one past its end (an edited
  // trainer_state.json, or other data) is refused rather than wrapped around.
  const int64_t windows = window_count(*data_, o_);
  if (start.epoch < 0 || start.window < 0 || start.window >= windows || start.position < 0)
    throw Error("data cursor (epoch " + std::to_string(start.epoch) + ", window " + std::to_string(start.window) + ", position " +
                std::to_string(start.position) + ") is outside the data's " + std::to_string(windows) + " window(s)");
  build_window(*data_, o_, start.epoch, start.window, order_);
  if (start.position > static_cast<int64_t>(order_.seqs.size()))
    throw Error("data cursor (epoch " + std::to_string(start.epoch) + ", window " + std::to_string(start.window) + ", position " +
                std::to_string(start.position) + ") is past the window's " + std::to_string(order_.seqs.size()) + " sequences");
  thread_ = std::thread([this] { run(); });
}

TrainLoader::~TrainLoader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void TrainLoader::run() {
  try {
    while (true) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || static_cast<int64_t>(queue_.size()) < o_.prefetch; });
        if (stop_) return;
      }
      Batch b = make_batch(*data_, o_, cursor_, order_);
      {
        std::lock_guard<std::mutex> lock(mu_);
        queue_.push_back(std::move(b));
      }
      cv_.notify_all();
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(mu_);
    error_ = std::current_exception();
    cv_.notify_all();
  }
}

Batch TrainLoader::next() {
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !queue_.empty() || error_; });
  wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (queue_.empty() && error_) std::rethrow_exception(error_);
  Batch b = std::move(queue_.front());
  queue_.pop_front();
  lock.unlock();
  cv_.notify_all();
  return b;
}

// ---------------------------------------------------------------------------------------------
// Validation
// ---------------------------------------------------------------------------------------------

EvalLoader::EvalLoader(std::shared_ptr<const ShardSet> data, int64_t micro_batch, int64_t token_budget, int rank, int world)
    : data_(std::move(data)), B_(micro_batch), budget_(token_budget), rank_(rank), world_(world) {}

bool EvalLoader::next(Batch& b) {
  if (seen_ >= budget_) return false;
  const ShardSet& d = *data_;
  const int64_t T = d.seq_len();
  b = Batch{};
  b.B = B_;
  b.T = T;
  b.tokens.assign(B_ * T, 0);
  b.targets.assign(B_ * T, 0);
  b.mask.assign(B_ * T, 0);
  int64_t taken = 0;
  for (int64_t k = 0; k < B_ * world_; ++k) {
    while (shard_ < d.shards() && index_ >= d.sequences(shard_)) ++shard_, index_ = 0;
    if (shard_ >= d.shards()) break;
    if (index_ == 0) d.ensure_verified(shard_);
    if (k / B_ == rank_) b.count += d.fill(shard_, index_, b, k % B_);
    b.global_count += d.targets(shard_, index_);
    ++index_;
    ++taken;
  }
  if (taken == 0) return false;
  seen_ += b.global_count;
  return true;
}

namespace {
std::string hex64(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}
}  // namespace

uint64_t check_data_identity(const ShardSet& set, const std::string& tokenizer, ShardLayout layout, int64_t model_vocab,
                             std::string* note) {
  uint64_t want = 0;
  if (!tokenizer.empty()) {
    if (::access(tokenizer.c_str(), R_OK) != 0)
      throw ConfigError("data.tokenizer: " + tokenizer + " does not exist (or cannot be read)");
    want = file_fingerprint(tokenizer);
  }
  uint64_t carried = 0;
  int64_t shard_vocab = 0;
  for (int64_t s = 0; s < set.shards(); ++s) {
    const Shard& sh = set.shard(s);
    const ShardHeader& h = sh.header();
    if (h.layout != layout)
      throw Error(sh.path() + ": its layout is " + layout_name(h.layout) + ", data.layout is " + layout_name(layout) +
                  " (tokenize again with --layout " + layout_name(layout) + ", or set data.layout=" + layout_name(h.layout) + ")");
    shard_vocab = h.vocab_size;  // (at most model_vocab: ShardSet checks; another tokenizer's shards: the hash below)
    if (h.tokenizer_hash == 0) continue;  // format version 1: no record
    if (want != 0 && h.tokenizer_hash != want)
      throw Error(sh.path() + ": tokenized with the tokenizer of hash " + hex64(h.tokenizer_hash) + ", data.tokenizer " + tokenizer +
                  " has hash " + hex64(want) + " (tokenize again with it, or point data.tokenizer at the shards' tokenizer)");
    if (carried != 0 && h.tokenizer_hash != carried)
      throw Error(sh.path() + ": tokenized with the tokenizer of hash " + hex64(h.tokenizer_hash) + ", " + set.shard(0).path() +
                  " with " + hex64(carried) + " (shards of two tokenizers in one data set)");
    carried = h.tokenizer_hash;
  }
  if (note && tokenizer.empty())
    *note = carried ? "data.tokenizer is not set: the shards record tokenizer hash " + hex64(carried)
                    : "data.tokenizer is not set and the shards record no tokenizer";
  if (note && model_vocab - shard_vocab >= 1024)  // a padding far beyond a round-up: worth a line
    *note += (note->empty() ? "" : "; ") + std::to_string(model_vocab - shard_vocab) + " of the model's " + std::to_string(model_vocab) +
             " embeddings are past the tokenizer's " + std::to_string(shard_vocab) + " pieces (never an input or a target)";
  return want ? want : carried;
}

}  // namespace multinorm
