// CRC-32C (include/multinorm/checksum.h): SSE4.2's crc32 instruction over three interleaved streams
// (the instruction has a latency of 3 cycles and a throughput of 1), combined by carry-less shifts
// of the partial CRCs; a slicing table where the instruction is missing.
#include "multinorm/checksum.h"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

#include "multinorm/error.h"

namespace multinorm {
namespace {

constexpr uint32_t kPoly = 0x82f63b78u;  // CRC-32C, reflected

const std::array<std::array<uint32_t, 256>, 8>& tables() {
  static const auto t = [] {
    std::array<std::array<uint32_t, 256>, 8> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = c & 1 ? (c >> 1) ^ kPoly : c >> 1;
      t[0][i] = c;
    }
    for (int s = 1; s < 8; ++s)
      for (uint32_t i = 0; i < 256; ++i) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xff];
    return t;
  }();
  return t;
}

uint32_t crc_table(uint32_t crc, const uint8_t* p, size_t n) {
  const auto& t = tables();
  while (n >= 8) {  // slicing by 8
    uint64_t v;
    std::memcpy(&v, p, 8);
    v ^= crc;
    crc = t[7][v & 0xff] ^ t[6][(v >> 8) & 0xff] ^ t[5][(v >> 16) & 0xff] ^ t[4][(v >> 24) & 0xff] ^ t[3][(v >> 32) & 0xff] ^
          t[2][(v >> 40) & 0xff] ^ t[1][(v >> 48) & 0xff] ^ t[0][v >> 56];
    p += 8, n -= 8;
  }
  while (n--) crc = (crc >> 8) ^ t[0][(crc ^ *p++) & 0xff];
  return crc;
}

// x^(8 n) mod P, applied to a CRC: what appending n zero bytes does to it (GF(2) matrix powers).
uint32_t gf2_times(const uint32_t* mat, uint32_t vec) {
  uint32_t sum = 0;
  for (int i = 0; vec; ++i, vec >>= 1)
    if (vec & 1) sum ^= mat[i];
  return sum;
}
void gf2_square(uint32_t* out, const uint32_t* mat) {
  for (int i = 0; i < 32; ++i) out[i] = gf2_times(mat, mat[i]);
}
// The operator that shifts a CRC over `bytes` zero bytes.
std::array<uint32_t, 32> zeros_operator(size_t bytes) {
  std::array<uint32_t, 32> op{}, sq{};
  op[0] = kPoly;  // one zero bit
  for (int i = 1; i < 32; ++i) op[i] = 1u << (i - 1);
  std::array<uint32_t, 32> result{};
  for (int i = 0; i < 32; ++i) result[i] = 1u << i;  // identity
  size_t bits = bytes * 8;
  while (bits) {
    if (bits & 1) {
      std::array<uint32_t, 32> r{};
      for (int i = 0; i < 32; ++i) r[i] = gf2_times(op.data(), result[i]);
      result = r;
    }
    gf2_square(sq.data(), op.data());
    op = sq;
    bits >>= 1;
  }
  return result;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t crc_hw(uint32_t crc, const uint8_t* p, size_t n) {
  constexpr size_t kBlock = 8192;  // per stream
  static const std::array<uint32_t, 32> shift = zeros_operator(kBlock);
  uint64_t c0 = crc;
  while (n >= 3 * kBlock) {  // three independent streams, then combined
    uint64_t c1 = 0, c2 = 0;
    const uint8_t *a = p, *b = p + kBlock, *c = p + 2 * kBlock;
    for (size_t i = 0; i < kBlock; i += 8) {
      uint64_t va, vb, vc;
      std::memcpy(&va, a + i, 8), std::memcpy(&vb, b + i, 8), std::memcpy(&vc, c + i, 8);
      c0 = _mm_crc32_u64(c0, va), c1 = _mm_crc32_u64(c1, vb), c2 = _mm_crc32_u64(c2, vc);
    }
    // crc(A B C) = shift(shift(crc(A)) ^ crc(B)) ^ crc(C), for the zero-initialised streams B and C
    uint32_t r = gf2_times(shift.data(), static_cast<uint32_t>(c0)) ^ static_cast<uint32_t>(c1);
    r = gf2_times(shift.data(), r) ^ static_cast<uint32_t>(c2);
    c0 = r;
    p += 3 * kBlock, n -= 3 * kBlock;
  }
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c0 = _mm_crc32_u64(c0, v);
    p += 8, n -= 8;
  }
  uint32_t c32 = static_cast<uint32_t>(c0);
  while (n--) c32 = _mm_crc32_u8(c32, *p++);
  return c32;
}
bool have_sse42() {
  static const bool yes = __builtin_cpu_supports("sse4.2");
  return yes;
}
#endif

}  // namespace

uint32_t crc32c(uint32_t crc, const void* data, size_t bytes) {
  const auto* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
#if defined(__x86_64__)
  if (have_sse42()) return ~crc_hw(crc, p, bytes);
#endif
  return ~crc_table(crc, p, bytes);
}

uint32_t crc32c_file(const std::string& path, uint64_t* bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(path + ": cannot open: " + std::strerror(errno));
  std::vector<char> buf(size_t(8) << 20);
  uint32_t crc = 0;
  uint64_t total = 0;
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      throw Error(path + ": read failed: " + std::strerror(err));
    }
    if (n == 0) break;
    crc = crc32c(crc, buf.data(), static_cast<size_t>(n));
    total += static_cast<uint64_t>(n);
  }
  ::close(fd);
  if (bytes) *bytes = total;
  return crc;
}

uint32_t masked_crc32c(const void* data, size_t bytes) {
  const uint32_t crc = crc32c(0, data, bytes);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string crc32c_name(uint32_t crc) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "crc32c:%08x", crc);
  return buf;
}

namespace {
thread_local ExpectedChecksums* t_expected = nullptr;
}  // namespace

ExpectedChecksums::ExpectedChecksums(std::map<std::string, ExpectedFile> by_path, std::string owner)
    : files_(std::move(by_path)), owner_(std::move(owner)), outer_(t_expected) {
  t_expected = this;
}
ExpectedChecksums::~ExpectedChecksums() { t_expected = outer_; }

std::vector<std::string> ExpectedChecksums::unread() const {
  std::vector<std::string> v;
  for (const auto& [path, e] : files_)
    if (!read_.count(path)) v.push_back(path);
  return v;
}

void check_read(const std::string& path, const void* data, size_t bytes) {
  for (ExpectedChecksums* s = t_expected; s; s = s->outer_) {
    auto it = s->files_.find(path);
    if (it == s->files_.end()) continue;
    s->read_[path] = true;
    const uint32_t crc = crc32c(0, data, bytes);
    if (bytes != it->second.bytes || crc != it->second.crc)
      throw CorruptFileError(path + " is damaged: " + std::to_string(bytes) + " bytes with " + crc32c_name(crc) + ", the manifest of " +
                             s->owner_ + " recorded " + std::to_string(it->second.bytes) + " bytes with " + crc32c_name(it->second.crc));
  }
}

}  // namespace multinorm
