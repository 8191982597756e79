// safetensors: round trips, and malformed files rejected with the file and tensor named.
#include <gtest/gtest.h>

#include <fstream>

#include "multinorm/error.h"
#include "multinorm/json_file.h"
#include "multinorm/llama_model.h"
#include "multinorm/model_io.h"
#include "multinorm/safetensors.h"
#include "test_util.h"

using namespace multinorm;
using multinorm::testing::TempDir;
using multinorm::testing::expect_error;

namespace {

std::string raw_file(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}

ModelConfig small_model() {
  ModelConfig m;
  m.vocab_size = 50;
  m.hidden_size = 16;
  m.intermediate_size = 20;
  m.num_hidden_layers = 2;
  m.num_attention_heads = 2;
  m.max_position_embeddings = 8;
  return m;
}

}  // namespace

TEST(Safetensors, RoundTripBothDtypes) {
  TempDir dir;
  const std::vector<float> a = {1.0f, -2.5f, 3.25f, 0.0f, 1e-3f, 7.0f};
  const std::string path = dir.path() + "/t.safetensors";
  write_safetensors(path, {from_f32_vector("a", {2, 3}, a.data(), DType::F32), from_f32_vector("b", {6}, a.data(), DType::BF16)},
                    {{"format", "pt"}});
  const SafetensorsFile f(path);
  EXPECT_EQ(f.names().size(), 2u);
  EXPECT_EQ(f.get("a").shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(to_f32_vector(f.get("a")), a);
  const auto b = to_f32_vector(f.get("b"));
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], std::fabs(a[i]) / 128);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  // The header is padded so that the data starts 8-byte aligned.
  const std::string bytes = read_text_file(path);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<uint8_t>(bytes[i])) << (8 * i);
  EXPECT_EQ(n % 8, 0u);
}

TEST(Safetensors, MalformedFilesAreRejected) {
  TempDir dir;
  auto write = [&](const std::string& name, const std::string& content) {
    std::ofstream(dir.path() + "/" + name, std::ios::binary) << content;
    return dir.path() + "/" + name;
  };
  expect_error([&] { SafetensorsFile(write("short", "abc")); }, {"short", "shorter than"});
  expect_error([&] { SafetensorsFile(write("len", raw_file("{}", "").substr(0, 8) + "{")); }, {"len", "exceeds the file"});
  expect_error([&] { SafetensorsFile(write("json", raw_file("{nope", ""))); }, {"json", "not a JSON object"});
  expect_error([&] { SafetensorsFile(write("dtype", raw_file(R"({"w":{"dtype":"F16","shape":[1],"data_offsets":[0,2]}})", "xx"))); },
               {"dtype", "tensor 'w'", "F16"});
  expect_error([&] { SafetensorsFile(write("trunc", raw_file(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", "12345678"))); },
               {"trunc", "tensor 'w'", "outside the 8 data bytes"});
  expect_error([&] { SafetensorsFile(write("size", raw_file(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", "12345678"))); },
               {"tensor 'w'", "need 12"});
  expect_error([&] {
    SafetensorsFile(write("overlap", raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                                              "123456789012")));
  }, {"overlap"});
  expect_error([&] { SafetensorsFile(dir.path() + "/absent"); }, {"absent", "cannot open"});
}

TEST(ModelIo, SaveLoadRoundTripAndShapeChecks) {
  TempDir dir;
  auto be = make_cpu_backend(1);
  const ModelConfig cfg = small_model();
  LlamaModel a(*be, cfg, DType::F32, 1, 4), b(*be, cfg, DType::F32, 1, 4);
  a.init_random(3);
  save_hf_model(a.store(), a.config(), dir.path() + "/fp32", DType::F32);
  load_hf_model(b.store(), b.config(), dir.path() + "/fp32");
  EXPECT_EQ(a.params_to_host(), b.params_to_host());
  const json hf = read_json_file(dir.path() + "/fp32/config.json");
  EXPECT_EQ(hf["model_type"], "llama");
  EXPECT_EQ(hf["architectures"][0], "LlamaForCausalLM");
  EXPECT_EQ(hf["hidden_size"], 16);
  // BF16 export is the RNE-rounded weights.
  save_hf_model(a.store(), a.config(), dir.path() + "/bf16", DType::BF16);
  LlamaModel c(*be, cfg, DType::BF16, 1, 4);
  c.init_random(3);
  LlamaModel d(*be, cfg, DType::BF16, 1, 4);
  load_hf_model(d.store(), d.config(), dir.path() + "/bf16");
  EXPECT_EQ(c.params_to_host(), d.params_to_host());
  // Another architecture is refused with the field named.
  ModelConfig wider = cfg;
  wider.hidden_size = 32;
  LlamaModel w(*be, wider, DType::F32, 1, 4);
  expect_error([&] { load_hf_model(w.store(), w.config(), dir.path() + "/fp32"); }, {"config.json", "hidden_size is 16", "has 32"});
  // A missing tensor is named.
  const SafetensorsFile full(dir.path() + "/fp32/model.safetensors");
  std::vector<TensorData> some;
  for (const auto& n : full.names())
    if (n != "model.norm.weight") some.push_back(full.get(n));
  write_safetensors(dir.path() + "/fp32/model.safetensors", some);
  expect_error([&] { load_hf_model(b.store(), b.config(), dir.path() + "/fp32"); }, {"missing tensor 'model.norm.weight'"});
}
