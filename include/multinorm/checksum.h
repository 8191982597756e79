// CRC-32C (Castagnoli) of checkpoint files. Chosen over zlib's CRC-32 (which the shards use for
// their headers) because x86-64 computes it in hardware (SSE4.2 crc32, three streams interleaved to
// hide its latency: over 10 GB/s per core, `multinorm bench checksum`), so verifying a 1.3B
// checkpoint costs a fraction of reading it; and over xxHash64 because a CRC guarantees to detect
// every burst of up to 32 flipped bits, the failure a bad disk or a truncated copy makes. A table
// fallback serves CPUs without SSE4.2.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace multinorm {

// Continues `crc` (0 to start) over [data, data + bytes).
uint32_t crc32c(uint32_t crc, const void* data, size_t bytes);
// The CRC-32C of a whole file, read in chunks; Error naming the file when it cannot be read.
uint32_t crc32c_file(const std::string& path, uint64_t* bytes = nullptr);
// TFRecord's masked CRC-32C of [data, data + bytes) (TensorBoard's event files):
// ((crc >> 15) | (crc << 17)) + 0xa282ead8, so a CRC stored inside checksummed data does not
// interact with the outer one.
uint32_t masked_crc32c(const void* data, size_t bytes);
// "crc32c:1a2b3c4d", the form manifests record.
std::string crc32c_name(uint32_t crc);

// Verification in the same pass as the read: while an ExpectedChecksums lives on this thread,
// read_text_file() of a file it lists checks the bytes it read against the recorded size and
// CRC-32C, and throws CorruptFileError naming the file and `owner` (the checkpoint) when they differ.
struct ExpectedFile {
  uint64_t bytes = 0;
  uint32_t crc = 0;
};
class ExpectedChecksums {
 public:
  ExpectedChecksums(std::map<std::string, ExpectedFile> by_path, std::string owner);
  ~ExpectedChecksums();
  ExpectedChecksums(const ExpectedChecksums&) = delete;
  ExpectedChecksums& operator=(const ExpectedChecksums&) = delete;
  // Files it lists that were not read while it lived.
  std::vector<std::string> unread() const;

 private:
  friend void check_read(const std::string& path, const void* data, size_t bytes);
  std::map<std::string, ExpectedFile> files_;
  std::map<std::string, bool> read_;
  std::string owner_;
  ExpectedChecksums* outer_;
};
// Called by read_text_file for every file it read.
void check_read(const std::string& path, const void* data, size_t bytes);

}  // namespace multinorm
