#include "multinorm/json_file.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include <fcntl.h>
#include <unistd.h>

#include "multinorm/error.h"

namespace multinorm {

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot open: " + std::strerror(errno));
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

json read_json_file(const std::string& path) {
  std::string text;
  try {
    text = read_text_file(path);
  } catch (const Error& e) {
    throw ConfigError(e.what());
  }
  try {
    return json::parse(text);
  } catch (const json::parse_error& e) {
    // nlohmann reports a byte offset: turn it into line:column, which is what an editor shows.
    size_t line = 1, col = 1;
    const size_t end = std::min<size_t>(e.byte, text.size());
    for (size_t i = 0; i + 1 < end; ++i) {
      if (text[i] == '\n') ++line, col = 1;
      else ++col;
    }
    std::string what = e.what();
    const auto pos = what.find("syntax error");
    throw ConfigError(path + ":" + std::to_string(line) + ":" + std::to_string(col) + ": invalid JSON: " +
                      (pos == std::string::npos ? what : what.substr(pos)));
  }
}

void write_text_file_atomic(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw Error(tmp + ": cannot create: " + std::strerror(errno));
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      throw Error(tmp + ": write failed: " + std::strerror(err));
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    ::unlink(tmp.c_str());
    throw Error(tmp + ": fsync/close failed: " + std::strerror(errno));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw Error(path + ": rename failed: " + std::strerror(err));
  }
}

}  // namespace multinorm
