// Reading JSON files with errors that name the file and the line and column at fault.
#pragma once
#include <string>

#include "multinorm/schema.h"

namespace multinorm {

json read_json_file(const std::string& path);  // throws ConfigError
std::string read_text_file(const std::string& path);  // throws Error
// Writes through a temporary file and rename, so a crash never leaves a half-written file.
void write_text_file_atomic(const std::string& path, const std::string& text);
// `path` and its missing parents (mkdir -p); an Error naming the path when it cannot be a directory.
void make_directories(const std::string& path);

}  // namespace multinorm
