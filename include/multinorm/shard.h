// Token shards: the binary files `multinorm data tokenize` writes and the loader memory-maps.
// Format (little-endian; docs/formats.md):
//   header (128 bytes): magic "MNSHARD1", version, header size, vocab size, token width (2 or 4
//   bytes, from the vocabulary size), eos and pad ids, seq_len, layout (rows | stream), document and
//   token counts, section offsets, CRC-32 of the sections;
//   tokens:  num_tokens ids (uint16 or uint32)
//   lengths: rows layout only, num_docs uint32 (row i is tokens[sum of lengths before i ...])
// A reader refuses a wrong magic or version, a size that does not match the header (truncation), a
// checksum mismatch or a token id >= vocab, naming the file.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace multinorm {

enum class ShardLayout : uint32_t { Rows = 0, Stream = 1 };
const char* layout_name(ShardLayout l);
ShardLayout parse_layout(const std::string& name);

struct ShardHeader {
  uint32_t version = 1;
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
};

constexpr uint32_t kShardHeaderBytes = 128;

// Streams a shard to `path` through `path + ".tmp"`, renamed by finish(): a crash leaves no shard.
class ShardWriter {
 public:
  ShardWriter(const std::string& path, uint32_t vocab_size, int32_t eos_id, int32_t pad_id, ShardLayout layout,
              uint32_t seq_len);
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

// A memory-mapped, validated shard.
class Shard {
 public:
  explicit Shard(const std::string& path, bool verify_checksum = true);
  ~Shard();
  Shard(Shard&&) noexcept;
  Shard(const Shard&) = delete;
  Shard& operator=(const Shard&) = delete;

  const std::string& path() const { return path_; }
  const ShardHeader& header() const { return h_; }
  uint32_t token(uint64_t i) const {
    return h_.token_bytes == 2 ? reinterpret_cast<const uint16_t*>(tokens_)[i] : reinterpret_cast<const uint32_t*>(tokens_)[i];
  }
  // Rows layout: row i's first token and length.
  uint64_t row_start(uint64_t i) const { return starts_[i]; }
  uint32_t row_length(uint64_t i) const { return lengths_[i]; }

 private:
  std::string path_;
  ShardHeader h_;
  void* map_ = nullptr;
  size_t size_ = 0;
  const uint8_t* tokens_ = nullptr;
  const uint32_t* lengths_ = nullptr;
  std::vector<uint64_t> starts_;
};

ShardHeader read_shard_header(const std::string& path);  // header alone (no mapping), validated

}  // namespace multinorm
