// Token shards: the binary files `multinorm data tokenize` writes and the loader memory-maps.
// Format (little-endian; docs/formats.md):
//   header (128 bytes): magic "MNSHARD1", version, header size, vocab size, token width (2 or 4
//   bytes, from the vocabulary size), eos and pad ids, seq_len, layout (rows | stream), document and
//   token counts, section offsets, CRC-32 of the sections; version 2 adds what the shard was made
//   from (tokenizer hash, input file size and mtime) and a CRC-32 of the header itself;
//   tokens:  num_tokens ids (uint16 or uint32)
//   lengths: rows layout only, num_docs uint32 (row i is tokens[sum of lengths before i ...])
// Opening a shard checks every header field against the file size before anything is read through
// it (no field is trusted), and the header checksum (version 2); verify() checks the data: its CRC,
// token ids < vocab, row lengths. Errors name the file. Version 1 shards are still read.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace multinorm {

enum class ShardLayout : uint32_t { Rows = 0, Stream = 1 };
const char* layout_name(ShardLayout l);
ShardLayout parse_layout(const std::string& name);

struct ShardHeader {
  uint32_t version = 2;
  uint32_t vocab_size = 0;
  uint32_t token_bytes = 2;
  int32_t eos_id = -1;
  int32_t pad_id = -1;
  uint32_t seq_len = 0;  // rows: every row holds at most seq_len tokens (EOS kept last)
  ShardLayout layout = ShardLayout::Rows;
  uint64_t num_docs = 0;
  uint64_t num_tokens = 0;
  uint64_t tokens_offset = 0, lengths_offset = 0;
  uint32_t crc32 = 0;
  // Provenance (version 2; zero in version 1): what `data tokenize` made the shard from.
  uint64_t tokenizer_hash = 0;  // FNV-1a 64 of the SentencePiece model file
  uint64_t input_bytes = 0;     // size of the input file
  int64_t input_mtime_ns = 0;   // its modification time
};

// FNV-1a 64 of a file's bytes (the tokenizer's identity in a shard's provenance).
uint64_t file_fingerprint(const std::string& path);

// A file's size and modification time (provenance and verification records); zeros when absent.
struct FileStamp {
  uint64_t bytes = 0;
  int64_t mtime_ns = 0;
};
FileStamp file_stamp(const std::string& path);

constexpr uint32_t kShardHeaderBytes = 128;

// Streams a shard to `path` through `path + ".tmp"`, renamed by finish(): a crash leaves no shard.
class ShardWriter {
 public:
  ShardWriter(const std::string& path, uint32_t vocab_size, int32_t eos_id, int32_t pad_id, ShardLayout layout,
              uint32_t seq_len);
  // Records what the shard is made from (written into the header by finish()).
  void set_provenance(uint64_t tokenizer_hash, uint64_t input_bytes, int64_t input_mtime_ns);
  ~ShardWriter();  // removes the temporary file when finish() was not reached
  // One document's token ids. Rows: truncated to seq_len with EOS kept last (call with EOS appended).
  void add_document(const std::vector<int32_t>& ids);
  const ShardHeader& header() const { return h_; }
  void finish();

 private:
  void write_tokens(const int32_t* ids, size_t n);
  std::string path_, tmp_;
  ShardHeader h_;
  int fd_ = -1;
  std::vector<uint32_t> lengths_;
  std::vector<uint8_t> buf_;
  uint32_t crc_ = 0;
  bool done_ = false;
};

// A memory-mapped shard. The constructor validates the header against the file size (and its
// checksum, version 2) and the row lengths; with `verify_data` it also runs verify().
class Shard {
 public:
  explicit Shard(const std::string& path, bool verify_data = true);
  ~Shard();
  Shard(Shard&&) noexcept;
  Shard(const Shard&) = delete;
  Shard& operator=(const Shard&) = delete;

  const std::string& path() const { return path_; }
  const ShardHeader& header() const { return h_; }
  uint32_t token(uint64_t i) const {
    return h_.token_bytes == 2 ? reinterpret_cast<const uint16_t*>(tokens_)[i] : reinterpret_cast<const uint32_t*>(tokens_)[i];
  }
  // The data checksum and every token id < vocab_size; Error naming the file otherwise. Records a
  // successful verification next to the shard (PATH.verified: size, mtime and checksum), so later
  // runs skip it while the file is unchanged.
  void verify() const;
  // True when PATH.verified records this exact file (same size, mtime and checksum).
  bool verification_recorded() const;
  // Rows layout: row i's first token and length.
  uint64_t row_start(uint64_t i) const { return starts_[i]; }
  uint32_t row_length(uint64_t i) const {
    uint32_t v;  // the section follows the tokens: 2-byte ids leave it only 2-byte aligned
    std::memcpy(&v, lengths_ + 4 * i, 4);
    return v;
  }

 private:
  std::string path_;
  ShardHeader h_;
  void* map_ = nullptr;
  size_t size_ = 0;
  const uint8_t* tokens_ = nullptr;
  const uint8_t* lengths_ = nullptr;  // rows layout: num_docs little-endian uint32, unaligned
  std::vector<uint64_t> starts_;
};

ShardHeader read_shard_header(const std::string& path);  // header alone (no mapping), validated

}  // namespace multinorm
