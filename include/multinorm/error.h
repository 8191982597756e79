// Errors a user can act on. Every message names the file, key, step or position at fault; the CLI
// prints it as "multinorm: error: <message>" and exits with status 2.
#pragma once
#include <stdexcept>
#include <string>

namespace multinorm {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// A configuration file, a --set override or a model config is invalid.
class ConfigError : public Error {
 public:
  explicit ConfigError(const std::string& message) : Error(message) {}
};

// A file's bytes are not what its checksum recorded (a checkpoint damaged on disk or in a copy).
class CorruptFileError : public Error {
 public:
  explicit CorruptFileError(const std::string& message) : Error(message) {}
};

}  // namespace multinorm
