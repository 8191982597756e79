// CRC-32C (include/multinorm/checksum.h) against a bit-at-a-time reference (the polynomial's
// definition), on every length through the hardware path's three-stream blocks and their tails; and
// the verification of files as they are read.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "multinorm/checksum.h"
#include "multinorm/error.h"
#include "multinorm/json_file.h"

using namespace multinorm;

namespace {
uint32_t crc32c_bitwise(const uint8_t* p, size_t n) {
  uint32_t crc = 0xffffffffu;
  for (size_t i = 0; i < n; ++i) {
    crc ^= p[i];
    for (int k = 0; k < 8; ++k) crc = crc & 1 ? (crc >> 1) ^ 0x82f63b78u : crc >> 1;
  }
  return ~crc;
}
}  // namespace

// TFRecord's mask (TensorBoard event files) over published CRC-32C values: RFC 3720's 32 zero
// bytes (0x8a9136aa), the empty string (0, so the mask's constant), and a masked value another
// TFRecord implementation's tests record for "1234567890asdfghjkl".
TEST(Checksum, MaskedCrc32cIsTfRecords) {
  const std::vector<uint8_t> zeros(32, 0);
  EXPECT_EQ(crc32c(0, zeros.data(), zeros.size()), 0x8a9136aau);
  EXPECT_EQ(masked_crc32c(zeros.data(), zeros.size()), 0x0fd7fffau);  // rotr(0x8a9136aa, 15) + 0xa282ead8
  EXPECT_EQ(masked_crc32c("", 0), 0xa282ead8u);
  EXPECT_EQ(masked_crc32c("1234567890asdfghjkl", 19), 4134599430u);
}

TEST(Checksum, Crc32cIsTheCastagnoliCrc) {
  const std::string check = "123456789";
  EXPECT_EQ(crc32c(0, check.data(), check.size()), 0xe3069283u);  // the catalogued check value
  std::mt19937 gen(3);
  std::vector<uint8_t> buf(3 * 8192 * 3 + 77);
  for (auto& b : buf) b = static_cast<uint8_t>(gen());
  // Lengths around the 8-byte words and the 3 x 8192-byte interleaved blocks, and offsets off alignment.
  for (size_t n : {0, 1, 7, 8, 9, 63, 8191, 24575, 24576, 24577, 49152, 49159, 73728 + 77 - 5})
    for (size_t off : {0, 1, 5})
      if (off + n <= buf.size()) {
        EXPECT_EQ(crc32c(0, buf.data() + off, n), crc32c_bitwise(buf.data() + off, n)) << n << " at " << off;
      }
  // Continuing a CRC over pieces equals one pass.
  const uint32_t whole = crc32c(0, buf.data(), buf.size());
  uint32_t parts = crc32c(0, buf.data(), 30001);
  parts = crc32c(parts, buf.data() + 30001, buf.size() - 30001);
  EXPECT_EQ(parts, whole);
}

TEST(Checksum, ReadsOfListedFilesAreVerifiedInTheSamePass) {
  char dir_template[] = "/tmp/multinorm-crc-XXXXXX";
  const std::string dir = ::mkdtemp(dir_template);
  const std::string path = dir + "/f.bin", other = dir + "/g.bin";
  std::string data(100000, 'x');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7);
  write_text_file_atomic(path, data);
  write_text_file_atomic(other, "unlisted");
  uint64_t bytes = 0;
  const uint32_t crc = crc32c_file(path, &bytes);
  EXPECT_EQ(bytes, data.size());
  EXPECT_EQ(crc, crc32c(0, data.data(), data.size()));
  {
    ExpectedChecksums scope({{path, {bytes, crc}}}, "a test checkpoint");
    EXPECT_EQ(read_text_file(path), data);
    EXPECT_EQ(read_text_file(other), "unlisted");  // not listed: not checked
    EXPECT_TRUE(scope.unread().empty());
    data[4321] ^= 0x10;  // one flipped bit
    write_text_file_atomic(path, data);
    try {
      read_text_file(path);
      ADD_FAILURE() << "a flipped bit passed";
    } catch (const CorruptFileError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(path + " is damaged"), std::string::npos) << m;
      EXPECT_NE(m.find("a test checkpoint recorded 100000 bytes with " + crc32c_name(crc)), std::string::npos) << m;
    }
  }
  EXPECT_NO_THROW(read_text_file(path));  // the scope has ended
  std::remove(path.c_str()), std::remove(other.c_str()), std::remove(dir.c_str());
}
