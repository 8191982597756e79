#include "multinorm/json_file.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "multinorm/checksum.h"
#include "multinorm/error.h"

namespace multinorm {

std::string read_text_file(const std::string& path) {
  // One buffer of the file's size, filled by read(): a 2.7 GB checkpoint costs 2.7 GB, not the
  // stream copies' three times that.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(path + ": cannot open: " + std::strerror(errno));
  auto read_some = [&](char* to, size_t n) {
    for (;;) {
      const ssize_t r = ::read(fd, to, n);
      if (r >= 0) return static_cast<size_t>(r);
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      throw Error(path + ": read failed: " + std::strerror(err));
    }
  };
  struct stat st {};
  std::string data(::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) ? static_cast<size_t>(st.st_size) : 0, '\0');
  size_t got = 0;
  while (got < data.size()) {
    const size_t n = read_some(&data[got], data.size() - got);
    if (n == 0) break;
    got += n;
  }
  data.resize(got);
  char chunk[1 << 16];  // what lies past the size fstat saw (a pipe, a file still growing)
  while (const size_t n = read_some(chunk, sizeof(chunk))) data.append(chunk, n);
  ::close(fd);
  check_read(path, data.data(), data.size());  // a checkpoint file: its checksum, in the same pass
  return data;
}

json read_json_file(const std::string& path) {
  std::string text;
  try {
    text = read_text_file(path);
  } catch (const CorruptFileError&) {
    throw;  // a checkpoint file that fails its checksum stays that
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

void make_directories(const std::string& path) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (!std::filesystem::is_directory(path))
    throw Error(path + ": cannot create the directory" + (ec ? ": " + ec.message() : std::string()));
}

}  // namespace multinorm
