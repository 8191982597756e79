// Reads C4-format files: gzip-compressed JSON Lines with a string field "text" (plus "url" and
// "timestamp"), streaming, one line at a time. A truncated or unreadable gzip stream is an Error
// naming the file; malformed lines are reported to the caller with their line number.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace multinorm {

class C4Reader {
 public:
  explicit C4Reader(const std::string& path);
  ~C4Reader();
  C4Reader(const C4Reader&) = delete;
  C4Reader& operator=(const C4Reader&) = delete;

  // Next raw line (without '\n'); false at the end of the file. `line` is 1-based.
  bool next_line(std::string& out, int64_t& line);

  const std::string& path() const { return path_; }
  // Compressed bytes read so far (the progress through the file on disk).
  int64_t compressed_offset() const;

 private:
  bool fill();
  std::string path_;
  void* gz_ = nullptr;
  std::string buf_;
  size_t pos_ = 0;
  bool eof_ = false;
  int64_t line_ = 0;
};

// Parses one C4 line: true and `text` set when it is a JSON object with a string "text".
bool parse_c4_line(const std::string& line, std::string& text);

// Expands a comma-separated list of globs into sorted existing paths; an unmatched glob is an Error.
std::vector<std::string> expand_globs(const std::string& patterns);

}  // namespace multinorm
