// The data loader: memory-mapped token shards -> micro-batches of (tokens, targets, loss mask).
//
// Sequences: rows layout, one document per sequence (x = row[0..T), y = row[1..T], positions past
// the row's end masked); stream layout, consecutive windows of T + 1 tokens (nothing masked).
// Order: per epoch, the shards are permuted (seed, epoch) and taken `shuffle_window` at a time;
// within a window every sequence of its shards is permuted (seed, epoch, window). This is the global
// order. Each global step takes B x world consecutive sequences of it; rank r gets the r-th block of
// B, so ranks' slices are disjoint and together cover the data. The cursor (epoch, window, position)
// fixes the next global step exactly: a checkpoint saves it and a resumed run continues with the very
// batches a continuous run would have seen. A background thread prepares `prefetch` micro-batches
// ahead so training does not wait on I/O.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "multinorm/batch.h"
#include "multinorm/schema.h"
#include "multinorm/shard.h"

namespace multinorm {

struct LoaderCursor {
  int64_t epoch = 0, window = 0, position = 0;
  json to_json() const { return {{"epoch", epoch}, {"window", window}, {"position", position}}; }
  static LoaderCursor from_json(const json& j);
  bool operator==(const LoaderCursor& o) const { return epoch == o.epoch && window == o.window && position == o.position; }
};

struct Batch {
  int64_t B = 0, T = 0;
  std::vector<int32_t> tokens, targets;
  std::vector<uint8_t> mask;
  int64_t count = 0;         // counted targets of this rank's micro-batch
  int64_t global_count = 0;  // counted targets of the whole global step (all ranks)
  LoaderCursor after;        // the cursor once this batch is consumed
  MicroBatch view() const { return {tokens.data(), targets.data(), mask.data(), B, T}; }
};

// The shards of one split and their sequences.
// Opening a set reads each shard's header and row lengths only (sizes and fields checked); the data
// of a shard is verified (checksum, token ids) the first time the loader touches it, in the loader's
// thread, unless a `.verified` record shows it was verified unchanged before (`data verify`, or the
// tokenizer that wrote it). A start on C4 therefore reads no shard in full.
class ShardSet {
 public:
  ShardSet(const std::vector<std::string>& paths, int64_t seq_len, int64_t vocab_size);
  // Verifies shard `s` once (thread-safe); Error naming the file when it is corrupt.
  void ensure_verified(int64_t s) const;
  int64_t shards() const { return static_cast<int64_t>(shards_.size()); }
  int64_t sequences(int64_t shard) const;
  int64_t total_sequences() const;
  // Fills row `slot` of a batch with sequence `index` of `shard`; returns its counted targets.
  int64_t fill(int64_t shard, int64_t index, Batch& b, int64_t slot) const;
  int64_t targets(int64_t shard, int64_t index) const;  // counted targets without filling
  int64_t seq_len() const { return T_; }
  const Shard& shard(int64_t s) const { return shards_[static_cast<size_t>(s)]; }

 private:
  std::vector<Shard> shards_;
  std::unique_ptr<std::once_flag[]> verified_;
  int64_t T_;
  int32_t filler_;
};

// The identity of a run's data, checked by train and eval before a token is read: every shard was
// tokenized with data.tokenizer's file (the FNV-1a hash its header records), in data.layout, for the
// model's vocabulary (the model may pad its vocabulary by less than 128 rows). A mismatch is an
// Error naming the shard and both values; a data.tokenizer that does not exist is a ConfigError. A
// config without data.tokenizer takes the shards' own record, and `note` says so. Returns the
// tokenizer hash the data carries (0: shards of format version 1, which record none).
uint64_t check_data_identity(const ShardSet& set, const std::string& tokenizer, ShardLayout layout, int64_t model_vocab,
                             std::string* note = nullptr);

// The permuted sequences of one (epoch, window), kept while the loader walks through it.
struct WindowOrder {
  int64_t epoch = -1, window = -1;
  std::vector<std::pair<int32_t, int64_t>> seqs;  // (shard, sequence)
};

struct LoaderOptions {
  int64_t micro_batch = 16;
  int rank = 0, world = 1;
  bool shuffle = true;
  uint64_t seed = 0;
  int64_t shuffle_window = 8;  // shards shuffled together
  int64_t prefetch = 4;
};

class TrainLoader {
 public:
  TrainLoader(std::shared_ptr<const ShardSet> data, const LoaderOptions& o, const LoaderCursor& start = {});
  ~TrainLoader();
  Batch next();  // blocks until the prefetch thread has the batch; rethrows its errors
  double wait_seconds() const { return wait_s_; }  // time next() spent waiting (data wait)

  // The same order without a thread (tests, and the validation of rank slicing).
  static Batch make_batch(const ShardSet& data, const LoaderOptions& o, LoaderCursor& cursor, WindowOrder& order);

 private:
  void run();
  std::shared_ptr<const ShardSet> data_;
  LoaderOptions o_;
  LoaderCursor cursor_;
  WindowOrder order_;
  std::deque<Batch> queue_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;
  double wait_s_ = 0;
};

// Validation: a fixed order over the shards (no shuffle), the same for every run; stops after the
// global step at which the counted targets reach `token_budget` (or at the end of the data).
class EvalLoader {
 public:
  EvalLoader(std::shared_ptr<const ShardSet> data, int64_t micro_batch, int64_t token_budget, int rank = 0, int world = 1);
  bool next(Batch& b);
  int64_t tokens_seen() const { return seen_; }  // global counted targets so far

 private:
  std::shared_ptr<const ShardSet> data_;
  int64_t B_, budget_, shard_ = 0, index_ = 0, seen_ = 0;
  int rank_, world_;
};

}  // namespace multinorm
