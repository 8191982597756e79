// SentencePiece tokenizer (T5's spiece.model, LLaMA's tokenizer.model, or one trained by
// `multinorm data train-tokenizer`), with an exact word-level memo for BPE models.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace multinorm {

// Per-thread memo of segment -> ids used by Tokenizer::encode (see there). Owned by the caller, one
// per thread; bounded: it is emptied when it holds max_entries segments.
class WordCache {
 public:
  explicit WordCache(size_t max_entries = size_t{1} << 20) : max_entries_(max_entries) {}
  size_t hits() const { return hits_; }
  size_t misses() const { return misses_; }

 private:
  friend class Tokenizer;
  struct Span {
    uint32_t offset, length;
  };
  std::unordered_map<std::string, Span> index_;
  std::vector<int32_t> ids_;  // the ids of every cached segment, back to back
  size_t max_entries_, hits_ = 0, misses_ = 0;
};

class Tokenizer {
 public:
  explicit Tokenizer(const std::string& model_path);
  ~Tokenizer();
  // Thread-safe. With a cache (one per thread) and a model where it is exact (word_cache_exact()),
  // the text is cut at spaces that follow a printable ASCII character and each segment's ids are
  // memoised; the result is identical to encoding the whole text (tested on random text and on the
  // default corpus). Without, or when not exact, it is SentencePiece's Encode.
  std::vector<int32_t> encode(const std::string& text, WordCache* cache = nullptr) const;
  std::string decode(const std::vector<int32_t>& ids) const;
  std::string piece(int32_t id) const;
  int32_t vocab_size() const;
  int32_t eos_id() const;  // -1 when the model has none
  int32_t pad_id() const;  // -1 when the model has none
  int32_t bos_id() const;  // -1 when the model has none (T5's; training never adds one)
  int32_t unk_id() const;
  // True when segment-wise encoding equals whole-text encoding for this model; why_not says why not.
  bool word_cache_exact() const { return word_cache_exact_; }
  const std::string& word_cache_why_not() const { return why_not_; }

 private:
  void append_segment(std::string_view segment, WordCache& cache, std::vector<int32_t>& out) const;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  bool word_cache_exact_ = false;
  std::string why_not_;
};

}  // namespace multinorm
