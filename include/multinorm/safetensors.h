// The safetensors format (Hugging Face): an 8-byte little-endian header length N, N bytes of JSON
// {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}, then the raw
// little-endian tensor bytes, offsets relative to the end of the header. docs/formats.md describes
// what multinorm writes and checks.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "multinorm/dtype.h"
#include "multinorm/schema.h"

namespace multinorm {

struct TensorData {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;  // little-endian elements
};

// Writes atomically (temporary file, fsync, rename); tensors in the given order.
void write_safetensors(const std::string& path, const std::vector<TensorData>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// Reads and validates the whole file: header length within the file, JSON well-formed, every
// tensor's dtype known (F32, BF16), offsets inside the data, sized shape x dtype, contiguous and
// non-overlapping. Errors name the file and the tensor.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  const std::string& path() const { return path_; }
  const std::vector<std::string>& names() const { return names_; }
  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  const TensorData& get(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  std::string path_;
  std::vector<std::string> names_;
  std::map<std::string, TensorData> index_;
  std::map<std::string, std::string> metadata_;
};

// Element i of a tensor as FP32.
std::vector<float> to_f32_vector(const TensorData& t);
TensorData from_f32_vector(const std::string& name, const std::vector<int64_t>& shape, const float* values,
                           DType dtype);

}  // namespace multinorm
