#include "multinorm/shard.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <vector>

#include "multinorm/error.h"
#include "multinorm/json_file.h"

namespace multinorm {

namespace {
constexpr char kMagic[8] = {'M', 'N', 'S', 'H', 'A', 'R', 'D', '1'};
constexpr uint32_t kHeaderCrcOffset = 124;  // version 2: CRC-32 of header bytes [0, 124)

uint32_t crc_of(const uint8_t* p, uint64_t n) {
  uint32_t crc = static_cast<uint32_t>(::crc32(0L, Z_NULL, 0));
  for (uint64_t off = 0; off < n; off += (1u << 30))
    crc = static_cast<uint32_t>(::crc32(crc, p + off, static_cast<uInt>(std::min<uint64_t>(1u << 30, n - off))));
  return crc;
}

// Header fields at fixed offsets.
void encode_header(const ShardHeader& h, uint8_t* out) {
  std::memset(out, 0, kShardHeaderBytes);
  std::memcpy(out, kMagic, 8);
  auto put32 = [&](size_t off, uint32_t v) { std::memcpy(out + off, &v, 4); };
  auto put64 = [&](size_t off, uint64_t v) { std::memcpy(out + off, &v, 8); };
  put32(8, h.version);
  put32(12, kShardHeaderBytes);
  put32(16, h.vocab_size);
  put32(20, h.token_bytes);
  put32(24, static_cast<uint32_t>(h.eos_id));
  put32(28, static_cast<uint32_t>(h.pad_id));
  put32(32, h.seq_len);
  put32(36, static_cast<uint32_t>(h.layout));
  put64(40, h.num_docs);
  put64(48, h.num_tokens);
  put64(56, h.tokens_offset);
  put64(64, h.lengths_offset);
  put32(72, h.crc32);
  put64(80, h.tokenizer_hash);
  put64(88, h.input_bytes);
  put64(96, static_cast<uint64_t>(h.input_mtime_ns));
  put32(kHeaderCrcOffset, crc_of(out, kHeaderCrcOffset));
}

// Every field is checked before the reader uses it, and against the file size: a corrupt header can
// never send a read outside the file.
ShardHeader decode_header(const uint8_t* in, uint64_t file_size, const std::string& path) {
  auto bad = [&](const std::string& why) { throw Error(path + ": not a valid multinorm shard: " + why); };
  if (file_size < kShardHeaderBytes) bad("shorter than its " + std::to_string(kShardHeaderBytes) + "-byte header (truncated?)");
  if (std::memcmp(in, kMagic, 8) != 0) bad("wrong magic (expected MNSHARD1)");
  auto get32 = [&](size_t off) { uint32_t v; std::memcpy(&v, in + off, 4); return v; };
  auto get64 = [&](size_t off) { uint64_t v; std::memcpy(&v, in + off, 8); return v; };
  ShardHeader h;
  h.version = get32(8);
  if (h.version != 1 && h.version != 2) bad("format version " + std::to_string(h.version) + ", this build reads versions 1 and 2");
  if (h.version >= 2 && get32(kHeaderCrcOffset) != crc_of(in, kHeaderCrcOffset))
    bad("header checksum mismatch (the header is corrupt)");
  if (get32(12) != kShardHeaderBytes) bad("header size " + std::to_string(get32(12)));
  h.vocab_size = get32(16);
  h.token_bytes = get32(20);
  h.eos_id = static_cast<int32_t>(get32(24));
  h.pad_id = static_cast<int32_t>(get32(28));
  h.seq_len = get32(32);
  const uint32_t layout = get32(36);
  if (layout > 1) bad("unknown layout " + std::to_string(layout));
  h.layout = static_cast<ShardLayout>(layout);
  h.num_docs = get64(40);
  h.num_tokens = get64(48);
  h.tokens_offset = get64(56);
  h.lengths_offset = get64(64);
  h.crc32 = get32(72);
  if (h.version >= 2) {
    h.tokenizer_hash = get64(80);
    h.input_bytes = get64(88);
    h.input_mtime_ns = static_cast<int64_t>(get64(96));
  }
  if (h.token_bytes != 2 && h.token_bytes != 4) bad("token width " + std::to_string(h.token_bytes));
  if (h.vocab_size == 0 || (h.token_bytes == 2 && h.vocab_size > 65536)) bad("vocab size " + std::to_string(h.vocab_size));
  for (const auto& [name, id] : {std::pair<const char*, int32_t>{"eos", h.eos_id}, {"pad", h.pad_id}})
    if (id < -1 || id >= static_cast<int64_t>(h.vocab_size)) bad(std::string(name) + " id " + std::to_string(id));
  if (h.tokens_offset != kShardHeaderBytes) bad("tokens offset " + std::to_string(h.tokens_offset));
  const uint64_t body = file_size - kShardHeaderBytes;
  if (h.num_tokens > body / h.token_bytes)  // before any multiplication can overflow
    bad("token count " + std::to_string(h.num_tokens) + " does not fit in a file of " + std::to_string(file_size) + " bytes (truncated or corrupt)");
  const uint64_t token_end = kShardHeaderBytes + h.num_tokens * h.token_bytes;
  uint64_t expect = token_end;
  if (h.layout == ShardLayout::Rows) {
    if (h.seq_len < 2) bad("rows layout with seq_len " + std::to_string(h.seq_len));
    if (h.lengths_offset != token_end) bad("lengths offset " + std::to_string(h.lengths_offset) + ", expected " + std::to_string(token_end));
    if (h.num_docs > (file_size - token_end) / 4)
      bad("document count " + std::to_string(h.num_docs) + " does not fit in a file of " + std::to_string(file_size) + " bytes (truncated or corrupt)");
    expect += h.num_docs * 4;
  } else if (h.lengths_offset != 0) {
    bad("stream layout with a lengths offset");
  }
  if (file_size != expect)
    bad("size " + std::to_string(file_size) + " bytes, the header describes " + std::to_string(expect) +
        (file_size < expect ? " (truncated)" : ""));
  return h;
}

}  // namespace

FileStamp file_stamp(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return {};
  return {static_cast<uint64_t>(st.st_size), static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec};
}

uint64_t file_fingerprint(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw Error(path + ": cannot open: " + std::strerror(errno));
  uint64_t h = 0xcbf29ce484222325ULL;
  std::vector<uint8_t> buf(1 << 16);
  while (true) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    for (ssize_t i = 0; i < n; ++i) h = (h ^ buf[static_cast<size_t>(i)]) * 0x100000001b3ULL;
  }
  ::close(fd);
  return h;
}

const char* layout_name(ShardLayout l) { return l == ShardLayout::Rows ? "rows" : "stream"; }

ShardLayout parse_layout(const std::string& name) {
  if (name == "rows") return ShardLayout::Rows;
  if (name == "stream") return ShardLayout::Stream;
  throw ConfigError("unknown shard layout '" + name + "' (expected rows or stream)");
}

ShardWriter::ShardWriter(const std::string& path, uint32_t vocab_size, int32_t eos_id, int32_t pad_id,
                         ShardLayout layout, uint32_t seq_len)
    : path_(path), tmp_(path + ".tmp") {
  h_.vocab_size = vocab_size;
  h_.token_bytes = vocab_size <= 65536 ? 2 : 4;
  h_.eos_id = eos_id;
  h_.pad_id = pad_id;
  h_.layout = layout;
  h_.seq_len = layout == ShardLayout::Rows ? seq_len : 0;
  h_.tokens_offset = kShardHeaderBytes;
  if (layout == ShardLayout::Rows && seq_len < 2) throw ConfigError("rows layout needs seq_len >= 2");
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd_ < 0) throw Error(tmp_ + ": cannot create: " + std::strerror(errno));
  uint8_t zero[kShardHeaderBytes] = {0};
  if (::write(fd_, zero, sizeof(zero)) != static_cast<ssize_t>(sizeof(zero))) throw Error(tmp_ + ": write failed");
  crc_ = static_cast<uint32_t>(::crc32(0L, Z_NULL, 0));
}

ShardWriter::~ShardWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!done_) ::unlink(tmp_.c_str());
}

void ShardWriter::set_provenance(uint64_t tokenizer_hash, uint64_t input_bytes, int64_t input_mtime_ns) {
  h_.tokenizer_hash = tokenizer_hash;
  h_.input_bytes = input_bytes;
  h_.input_mtime_ns = input_mtime_ns;
}

void ShardWriter::write_tokens(const int32_t* ids, size_t n) {
  const size_t w = h_.token_bytes;
  buf_.resize(n * w);
  for (size_t i = 0; i < n; ++i) {
    if (ids[i] < 0 || static_cast<uint32_t>(ids[i]) >= h_.vocab_size)
      throw Error(path_ + ": token id " + std::to_string(ids[i]) + " outside the vocabulary of " + std::to_string(h_.vocab_size));
    const uint32_t v = static_cast<uint32_t>(ids[i]);
    std::memcpy(buf_.data() + i * w, &v, w);  // little-endian: the low bytes
  }
  crc_ = static_cast<uint32_t>(::crc32(crc_, buf_.data(), static_cast<uInt>(buf_.size())));
  size_t done = 0;
  while (done < buf_.size()) {
    const ssize_t k = ::write(fd_, buf_.data() + done, buf_.size() - done);
    if (k < 0) {
      if (errno == EINTR) continue;
      throw Error(tmp_ + ": write failed: " + std::strerror(errno));
    }
    done += static_cast<size_t>(k);
  }
  h_.num_tokens += n;
}

void ShardWriter::add_document(const std::vector<int32_t>& ids) {
  if (ids.empty()) return;
  if (h_.layout == ShardLayout::Rows) {
    std::vector<int32_t> row(ids.begin(), ids.begin() + std::min<size_t>(ids.size(), h_.seq_len));
    if (ids.size() > h_.seq_len && h_.eos_id >= 0) row.back() = h_.eos_id;  // truncated: EOS stays last (T5's rule)
    write_tokens(row.data(), row.size());
    lengths_.push_back(static_cast<uint32_t>(row.size()));
  } else {
    write_tokens(ids.data(), ids.size());
  }
  ++h_.num_docs;
}

void ShardWriter::finish() {
  if (h_.layout == ShardLayout::Rows) {
    h_.lengths_offset = kShardHeaderBytes + h_.num_tokens * h_.token_bytes;
    const size_t bytes = lengths_.size() * 4;
    crc_ = static_cast<uint32_t>(::crc32(crc_, reinterpret_cast<const Bytef*>(lengths_.data()), static_cast<uInt>(bytes)));
    if (::write(fd_, lengths_.data(), bytes) != static_cast<ssize_t>(bytes)) throw Error(tmp_ + ": write failed");
  }
  h_.crc32 = crc_;
  uint8_t head[kShardHeaderBytes];
  encode_header(h_, head);
  if (::pwrite(fd_, head, sizeof(head), 0) != static_cast<ssize_t>(sizeof(head))) throw Error(tmp_ + ": write failed");
  if (::fsync(fd_) != 0 || ::close(fd_) != 0) throw Error(tmp_ + ": fsync failed");
  fd_ = -1;
  if (std::rename(tmp_.c_str(), path_.c_str()) != 0) throw Error(path_ + ": rename failed: " + std::strerror(errno));
  done_ = true;
  // Written and checksummed here: verified by construction, so recorded (see Shard::verify).
  const FileStamp f = file_stamp(path_);
  write_text_file_atomic(path_ + ".verified",
                         json{{"size", f.bytes}, {"mtime_ns", f.mtime_ns}, {"crc32", h_.crc32}}.dump() + "\n");
}

ShardHeader read_shard_header(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw Error(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  ::fstat(fd, &st);
  uint8_t head[kShardHeaderBytes] = {0};
  const ssize_t n = ::pread(fd, head, sizeof(head), 0);
  ::close(fd);
  if (n < 0) throw Error(path + ": read failed");
  return decode_header(head, static_cast<uint64_t>(st.st_size), path);
}

Shard::Shard(const std::string& path, bool verify_data) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw Error(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  ::fstat(fd, &st);
  size_ = static_cast<size_t>(st.st_size);
  if (size_ < kShardHeaderBytes) {
    ::close(fd);
    decode_header(nullptr, size_, path);  // throws the "truncated" error
  }
  map_ = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    throw Error(path + ": mmap failed: " + std::strerror(errno));
  }
  const uint8_t* base = static_cast<const uint8_t*>(map_);
  h_ = decode_header(base, size_, path);
  tokens_ = base + h_.tokens_offset;
  if (h_.layout == ShardLayout::Rows) {  // the header placed the lengths inside the file
    lengths_ = base + h_.lengths_offset;
    starts_.resize(h_.num_docs);
    uint64_t s = 0;
    for (uint64_t i = 0; i < h_.num_docs; ++i) {
      const uint32_t len = row_length(i);
      if (len == 0 || len > h_.seq_len)
        throw Error(path + ": row " + std::to_string(i) + " has length " + std::to_string(len) +
                    " (rows hold 1 to seq_len " + std::to_string(h_.seq_len) + " tokens): the file is corrupt");
      starts_[i] = s;
      s += len;
    }
    if (s != h_.num_tokens) throw Error(path + ": row lengths sum to " + std::to_string(s) + ", not " + std::to_string(h_.num_tokens));
  }
  if (verify_data) verify();
}

void Shard::verify() const {
  const uint8_t* base = static_cast<const uint8_t*>(map_);
  if (crc_of(base + kShardHeaderBytes, size_ - kShardHeaderBytes) != h_.crc32)
    throw Error(path_ + ": checksum mismatch (the file is corrupt)");
  uint32_t top = 0;
  for (uint64_t i = 0; i < h_.num_tokens; ++i) top = std::max(top, token(i));
  if (h_.num_tokens && top >= h_.vocab_size)
    throw Error(path_ + ": token id " + std::to_string(top) + " >= vocab_size " + std::to_string(h_.vocab_size));
  // The record is best effort: a read-only data directory just means verifying again next time.
  const FileStamp f = file_stamp(path_);
  const json rec = {{"size", f.bytes}, {"mtime_ns", f.mtime_ns}, {"crc32", h_.crc32}};
  try {
    write_text_file_atomic(path_ + ".verified", rec.dump() + "\n");
  } catch (const Error&) {
  }
}

bool Shard::verification_recorded() const {
  std::ifstream in(path_ + ".verified");
  if (!in) return false;
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const json rec = json::parse(text, nullptr, false);
  if (!rec.is_object()) return false;
  const FileStamp f = file_stamp(path_);
  return rec.value("size", uint64_t{0}) == f.bytes && rec.value("mtime_ns", int64_t{-1}) == f.mtime_ns &&
         rec.value("crc32", uint64_t{1} << 40) == h_.crc32;
}

Shard::Shard(Shard&& o) noexcept
    : path_(std::move(o.path_)), h_(o.h_), map_(o.map_), size_(o.size_), tokens_(o.tokens_), lengths_(o.lengths_),
      starts_(std::move(o.starts_)) {
  o.map_ = nullptr;
}

Shard::~Shard() {
  if (map_) ::munmap(map_, size_);
}

}  // namespace multinorm
