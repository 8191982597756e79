#include "multinorm/safetensors.h"

#include <algorithm>
#include <cstring>

#include "../../kernels/common/bf16.h"
#include "multinorm/error.h"
#include "multinorm/json_file.h"

namespace multinorm {

namespace {
const char* st_dtype(DType t) { return t == DType::F32 ? "F32" : "BF16"; }
int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}
}  // namespace

void write_safetensors(const std::string& path, const std::vector<TensorData>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) {
    json m = json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header["__metadata__"] = m;
  }
  int64_t offset = 0;
  for (const auto& t : tensors) {
    if (static_cast<int64_t>(t.bytes.size()) != numel(t.shape) * dtype_bytes(t.dtype))
      throw Error(path + ": tensor '" + t.name + "' has " + std::to_string(t.bytes.size()) + " bytes for its shape");
    header[t.name] = {{"dtype", st_dtype(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + static_cast<int64_t>(t.bytes.size())}}};
    offset += static_cast<int64_t>(t.bytes.size());
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // align the data to 8 bytes, as the reference writer does
  std::string out(8, '\0');
  const uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  out += h;
  out.reserve(out.size() + offset);
  for (const auto& t : tensors) out.append(reinterpret_cast<const char*>(t.bytes.data()), t.bytes.size());
  write_text_file_atomic(path, out);
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  const std::string data = read_text_file(path);
  auto bad = [&](const std::string& why) { throw Error(path + ": not a valid safetensors file: " + why); };
  if (data.size() < 8) bad("shorter than its 8-byte header length (" + std::to_string(data.size()) + " bytes)");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<uint8_t>(data[i])) << (8 * i);
  if (n > data.size() - 8) bad("header length " + std::to_string(n) + " exceeds the file (truncated?)");
  const json header = json::parse(data.begin() + 8, data.begin() + 8 + static_cast<int64_t>(n), nullptr, false);
  if (header.is_discarded() || !header.is_object()) bad("the header is not a JSON object");
  const int64_t data_start = 8 + static_cast<int64_t>(n), data_size = static_cast<int64_t>(data.size()) - data_start;
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it.value().is_object()) bad("__metadata__ is not an object");
      for (auto m = it.value().begin(); m != it.value().end(); ++m)
        if (m.value().is_string()) metadata_[m.key()] = m.value().get<std::string>();
      continue;
    }
    const std::string& name = it.key();
    const json& e = it.value();
    auto tbad = [&](const std::string& why) { bad("tensor '" + name + "': " + why); };
    if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") || !e.contains("data_offsets"))
      tbad("needs dtype, shape and data_offsets");
    TensorData t;
    t.name = name;
    const std::string dt = e["dtype"].is_string() ? e["dtype"].get<std::string>() : "";
    if (dt == "F32") t.dtype = DType::F32;
    else if (dt == "BF16") t.dtype = DType::BF16;
    else tbad("dtype '" + dt + "' is not supported (F32, BF16)");
    if (!e["shape"].is_array()) tbad("shape is not an array");
    for (const auto& d : e["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) tbad("shape has a non-integer or negative dimension");
      t.shape.push_back(d.get<int64_t>());
    }
    const json& off = e["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_integer() || !off[1].is_number_integer()) tbad("data_offsets must be [begin, end]");
    const int64_t b = off[0].get<int64_t>(), en = off[1].get<int64_t>();
    if (b < 0 || en < b || en > data_size) tbad("data_offsets [" + std::to_string(b) + ", " + std::to_string(en) + "] outside the " + std::to_string(data_size) + " data bytes (truncated?)");
    if (en - b != numel(t.shape) * dtype_bytes(t.dtype)) tbad("holds " + std::to_string(en - b) + " bytes, its shape and dtype need " + std::to_string(numel(t.shape) * dtype_bytes(t.dtype)));
    t.bytes.assign(data.begin() + data_start + b, data.begin() + data_start + en);
    ranges.push_back({b, en});
    names_.push_back(name);
    index_.emplace(name, std::move(t));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].first < ranges[i - 1].second) bad("tensors overlap in the data section");
}

const TensorData& SafetensorsFile::get(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) throw Error(path_ + ": no tensor '" + name + "'");
  return it->second;
}

std::vector<float> to_f32_vector(const TensorData& t) {
  const size_t n = t.bytes.size() / dtype_bytes(t.dtype);
  std::vector<float> out(n);
  if (t.dtype == DType::F32) {
    std::memcpy(out.data(), t.bytes.data(), n * 4);
  } else {
    for (size_t i = 0; i < n; ++i) {
      bf16 b;
      std::memcpy(&b.bits, t.bytes.data() + 2 * i, 2);
      out[i] = to_f32(b);
    }
  }
  return out;
}

TensorData from_f32_vector(const std::string& name, const std::vector<int64_t>& shape, const float* values, DType dtype) {
  TensorData t{name, dtype, shape, {}};
  const int64_t n = numel(shape);
  t.bytes.resize(n * dtype_bytes(dtype));
  if (dtype == DType::F32) {
    std::memcpy(t.bytes.data(), values, n * 4);
  } else {
    for (int64_t i = 0; i < n; ++i) {
      const bf16 b = to_bf16(values[i]);
      std::memcpy(t.bytes.data() + 2 * i, &b.bits, 2);
    }
  }
  return t;
}

}  // namespace multinorm
