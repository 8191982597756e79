#include "multinorm/c4_reader.h"

#include <glob.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <nlohmann/json.hpp>

#include "multinorm/error.h"

namespace multinorm {

C4Reader::C4Reader(const std::string& path) : path_(path) {
  gz_ = ::gzopen(path.c_str(), "rb");
  if (!gz_) throw Error(path + ": cannot open: " + std::strerror(errno));
  ::gzbuffer(static_cast<gzFile>(gz_), 1 << 20);
}

C4Reader::~C4Reader() {
  if (gz_) ::gzclose(static_cast<gzFile>(gz_));
}

bool C4Reader::fill() {
  if (eof_) return false;
  buf_.erase(0, pos_);
  pos_ = 0;
  const size_t old = buf_.size();
  buf_.resize(old + (1 << 20));
  const int n = ::gzread(static_cast<gzFile>(gz_), buf_.data() + old, 1 << 20);
  int err = Z_OK;
  const char* msg = ::gzerror(static_cast<gzFile>(gz_), &err);
  if (n < 0 || (err != Z_OK && err != Z_STREAM_END))
    throw Error(path_ + ": unreadable gzip stream (" + std::string(msg ? msg : "error") + "; truncated or corrupt?)");
  buf_.resize(old + static_cast<size_t>(std::max(n, 0)));
  if (n == 0) eof_ = true;
  return n > 0;
}

int64_t C4Reader::compressed_offset() const { return static_cast<int64_t>(::gzoffset(static_cast<gzFile>(gz_))); }

bool C4Reader::next_line(std::string& out, int64_t& line) {
  while (true) {
    const size_t nl = buf_.find('\n', pos_);
    if (nl != std::string::npos) {
      out.assign(buf_, pos_, nl - pos_);
      pos_ = nl + 1;
      line = ++line_;
      return true;
    }
    if (!fill()) {
      if (pos_ < buf_.size()) {  // last line without '\n'
        out.assign(buf_, pos_, std::string::npos);
        pos_ = buf_.size();
        line = ++line_;
        return true;
      }
      return false;
    }
  }
}

bool parse_c4_line(const std::string& line, std::string& text) {
  const auto j = nlohmann::json::parse(line, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return false;
  const auto it = j.find("text");
  if (it == j.end() || !it->is_string()) return false;
  text = it->get<std::string>();
  return true;
}

std::vector<std::string> expand_globs(const std::string& patterns) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= patterns.size()) {
    const size_t comma = patterns.find(',', start);
    const std::string p = patterns.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    start = comma == std::string::npos ? patterns.size() + 1 : comma + 1;
    if (p.empty()) continue;
    glob_t g{};
    const int rc = ::glob(p.c_str(), 0, nullptr, &g);
    if (rc != 0 || g.gl_pathc == 0) {
      ::globfree(&g);
      throw Error(p + ": no file matches");
    }
    for (size_t i = 0; i < g.gl_pathc; ++i) out.push_back(g.gl_pathv[i]);
    ::globfree(&g);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

}  // namespace multinorm
