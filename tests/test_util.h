// Helpers shared by the tests: temporary directories and files.
#pragma once
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "multinorm/error.h"

#include <unistd.h>

namespace multinorm::testing {

// A fresh directory under $TMPDIR, removed when the object dies.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/multinorm-test-XXXXXX";
    path_ = ::mkdtemp(tmpl.data()) ? tmpl : "";
  }
  ~TempDir() {
    if (!path_.empty()) std::system(("rm -rf '" + path_ + "'").c_str());
  }
  const std::string& path() const { return path_; }
  std::string write(const std::string& name, const std::string& text) const {
    const std::string p = path_ + "/" + name;
    std::ofstream(p) << text;
    return p;
  }

 private:
  std::string path_;
};

// Expects fn() to throw an E whose message contains every one of `parts`.
template <class E = multinorm::Error>
void expect_error(const std::function<void()>& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "expected an error";
  } catch (const E& e) {
    const std::string msg = e.what();
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "message: " << msg << "\nmissing: " << p;
  }
}

}  // namespace multinorm::testing
