#include "multinorm/tokenizer.h"

#include <sentencepiece_processor.h>

#include <algorithm>
#include <cstdint>

#include "multinorm/error.h"

namespace multinorm {

namespace {

// The few fields of SentencePiece's ModelProto (sentencepiece_model.proto, proto2) that decide whether
// word-level memoisation is exact. Debian's libsentencepiece-dev ships no generated proto header, so
// the serialized model is read with a minimal protobuf wire-format reader.
struct SpmSpec {
  int model_type = 1;  // TrainerSpec.model_type (3): UNIGRAM=1 BPE=2 WORD=3 CHAR=4
  bool treat_whitespace_as_suffix = false;  // TrainerSpec (24)
  std::string normalizer = "nmt_nfkc";      // NormalizerSpec.name (1)
  bool add_dummy_prefix = true;             // NormalizerSpec (3)
  bool escape_whitespaces = true;           // NormalizerSpec (5)
};

struct WireReader {
  const uint8_t* p;
  const uint8_t* end;
  bool ok = true;
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64 && p < end; shift += 7) {
      const uint8_t b = *p++;
      v |= uint64_t{b & 0x7Fu} << shift;
      if (!(b & 0x80)) return v;
    }
    ok = false;
    return 0;
  }
  // Visits each field: f(number, wire_type, varint_value, bytes_begin, bytes_size).
  template <class F>
  void each(F&& f) {
    while (ok && p < end) {
      const uint64_t key = varint();
      const int number = static_cast<int>(key >> 3), type = static_cast<int>(key & 7);
      if (type == 0) {
        f(number, type, varint(), nullptr, 0);
      } else if (type == 2) {
        const uint64_t n = varint();
        if (n > static_cast<uint64_t>(end - p)) return void(ok = false);
        f(number, type, 0, p, static_cast<size_t>(n));
        p += n;
      } else if (type == 1 || type == 5) {
        const size_t n = type == 1 ? 8 : 4;
        if (n > static_cast<size_t>(end - p)) return void(ok = false);
        p += n;
      } else {
        return void(ok = false);  // groups (3, 4) are not used by sentencepiece_model.proto
      }
    }
  }
};

bool parse_spm_spec(const std::string& serialized, SpmSpec& spec) {
  const auto* b = reinterpret_cast<const uint8_t*>(serialized.data());
  WireReader model{b, b + serialized.size()};
  bool ok = true;
  model.each([&](int number, int type, uint64_t, const uint8_t* data, size_t size) {
    if (type != 2 || (number != 2 && number != 3)) return;
    WireReader sub{data, data + size};
    sub.each([&](int field, int t, uint64_t v, const uint8_t* d, size_t n) {
      if (number == 2 && t == 0 && field == 3) spec.model_type = static_cast<int>(v);
      if (number == 2 && t == 0 && field == 24) spec.treat_whitespace_as_suffix = v != 0;
      if (number == 3 && t == 2 && field == 1) spec.normalizer.assign(reinterpret_cast<const char*>(d), n);
      if (number == 3 && t == 0 && field == 3) spec.add_dummy_prefix = v != 0;
      if (number == 3 && t == 0 && field == 5) spec.escape_whitespaces = v != 0;
    });
    ok = ok && sub.ok;
  });
  return ok && model.ok;
}

// A piece "spans a word boundary" when it holds a word character followed by U+2581 (the escaped
// space): such a piece could join the end of one segment with the start of the next.
bool spans_word_boundary(const std::string& piece) {
  static const std::string kSpace = "\xE2\x96\x81";
  for (size_t k = piece.find(kSpace, 1); k != std::string::npos; k = piece.find(kSpace, k + 1))
    if (k < 3 || piece.compare(k - 3, 3, kSpace) != 0) return true;
  return false;
}

// Segment boundaries sit before a space whose preceding byte is printable ASCII: that byte normalises
// to itself (identity, NFKC, case folding) and never to whitespace, so the boundary in the normalised
// text is always "<word character>|U+2581".
bool boundary_before(const std::string& text, size_t p) {
  const auto prev = static_cast<unsigned char>(text[p - 1]);
  return text[p] == ' ' && prev > 0x20 && prev < 0x7F;
}

constexpr size_t kMaxCachedSegmentBytes = 64;

}  // namespace

Tokenizer::Tokenizer(const std::string& model_path) : sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {
  const auto status = sp_->Load(model_path);
  if (!status.ok()) throw Error(model_path + ": cannot load SentencePiece model: " + status.ToString());

  // Why memoising segments is exact for BPE: SentencePiece's BPE merges an adjacent pair only when the
  // concatenation is a piece of the vocabulary. If no piece spans a word boundary, no merge ever
  // crosses one, so each segment evolves alone and the result is the concatenation of the segments'
  // results. The dummy prefix stands for the space that starts each later segment (which is therefore
  // dropped before encoding it alone). Unigram's Viterbi also factorises in exact arithmetic, but its
  // float path scores do not, so near-ties could resolve differently: unigram is encoded whole.
  SpmSpec spec;
  const std::string names[] = {"identity", "nmt_nfkc", "nfkc", "nmt_nfkc_cf", "nfkc_cf"};
  if (!parse_spm_spec(sp_->serialized_model_proto(), spec)) {
    why_not_ = "the model's specification could not be read";
  } else if (spec.model_type != 2) {
    why_not_ = "not a BPE model";
  } else if (spec.treat_whitespace_as_suffix || !spec.add_dummy_prefix || !spec.escape_whitespaces) {
    why_not_ = "whitespace handling differs from the default (suffix, no dummy prefix or unescaped)";
  } else if (std::find(std::begin(names), std::end(names), spec.normalizer) == std::end(names)) {
    why_not_ = "custom normalisation rules '" + spec.normalizer + "'";
  } else {
    for (int id = 0; id < sp_->GetPieceSize() && why_not_.empty(); ++id)
      if (!sp_->IsControl(id) && !sp_->IsUnknown(id) && !sp_->IsByte(id) && spans_word_boundary(sp_->IdToPiece(id)))
        why_not_ = "piece " + std::to_string(id) + " '" + sp_->IdToPiece(id) + "' spans a word boundary";
  }
  word_cache_exact_ = why_not_.empty();
}
Tokenizer::~Tokenizer() = default;

std::vector<int32_t> Tokenizer::encode(const std::string& text, WordCache* cache) const {
  if (!cache || !word_cache_exact_) {
    std::vector<int> ids;
    const auto status = sp_->Encode(text, &ids);
    if (!status.ok()) throw Error("tokenizer: " + status.ToString());
    return std::vector<int32_t>(ids.begin(), ids.end());
  }
  // Segments: [0, b1) [b1, b2) ... where each b is a boundary_before() position; none after the last
  // non-space character, so trailing spaces stay with the last word (a lone trailing space would
  // otherwise become an empty segment, which SentencePiece encodes as nothing, not as U+2581).
  std::vector<int32_t> out;
  out.reserve(text.size() / 3);
  const size_t last = text.find_last_not_of(' ');
  size_t start = 0;
  for (size_t p = 1; last != std::string::npos && p < last; ++p) {
    if (!boundary_before(text, p)) continue;
    append_segment(std::string_view(text).substr(start + (start > 0), p - start - (start > 0)), *cache, out);
    start = p;
  }
  append_segment(std::string_view(text).substr(start + (start > 0)), *cache, out);
  return out;
}

void Tokenizer::append_segment(std::string_view segment, WordCache& cache, std::vector<int32_t>& out) const {
  std::string key(segment);
  const auto it = cache.index_.find(key);
  if (it != cache.index_.end()) {
    ++cache.hits_;
    const int32_t* ids = cache.ids_.data() + it->second.offset;
    out.insert(out.end(), ids, ids + it->second.length);
    return;
  }
  ++cache.misses_;
  std::vector<int> ids;
  const auto status = sp_->Encode(key, &ids);
  if (!status.ok()) throw Error("tokenizer: " + status.ToString());
  out.insert(out.end(), ids.begin(), ids.end());
  if (key.size() > kMaxCachedSegmentBytes) return;  // long runs without spaces (URLs, code) rarely repeat
  if (cache.index_.size() >= cache.max_entries_) {
    cache.index_.clear();
    cache.ids_.clear();
  }
  cache.index_.emplace(std::move(key), WordCache::Span{static_cast<uint32_t>(cache.ids_.size()),
                                                       static_cast<uint32_t>(ids.size())});
  cache.ids_.insert(cache.ids_.end(), ids.begin(), ids.end());
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  sp_->Decode(std::vector<int>(ids.begin(), ids.end()), &out);
  return out;
}

std::string Tokenizer::piece(int32_t id) const { return sp_->IdToPiece(id); }
int32_t Tokenizer::vocab_size() const { return sp_->GetPieceSize(); }
int32_t Tokenizer::eos_id() const { return sp_->eos_id(); }
int32_t Tokenizer::pad_id() const { return sp_->pad_id(); }
int32_t Tokenizer::bos_id() const { return sp_->bos_id(); }
int32_t Tokenizer::unk_id() const { return sp_->unk_id(); }

}  // namespace multinorm
