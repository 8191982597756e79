// Writes what tests/torch_crosscheck.py compares against PyTorch: the model (HF form), one batch,
// multinorm's loss, logits and every parameter gradient.
//   dump_for_torch <model config> <out dir> <fp32|bf16>
#include <cstdio>
#include <random>

#include "multinorm/json_file.h"
#include "multinorm/llama_model.h"
#include "multinorm/model_io.h"
#include "multinorm/safetensors.h"

using namespace multinorm;

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: dump_for_torch <model config> <out dir> <fp32|bf16>\n");
    return 2;
  }
  const ModelConfig cfg = load_model_config(argv[1]);
  const std::string out = argv[2];
  const DType dt = parse_dtype(argv[3]);
  const int64_t B = 3, T = 37;
  auto be = make_cpu_backend(2);
  LlamaModel model(*be, cfg, dt, B, T);
  model.init_random(11);
  std::mt19937 gen(5);
  std::vector<int32_t> tokens(B * T), targets(B * T);
  std::vector<uint8_t> mask(B * T, 1);
  for (auto& t : tokens) t = static_cast<int32_t>(gen() % cfg.vocab_size);
  for (int64_t i = 0; i < B * T; ++i) targets[i] = (i % T + 1 < T) ? tokens[i + 1] : 0;
  for (int64_t t = T - 9; t < T; ++t) mask[1 * T + t] = 0;  // sequence 1 ends in padding
  const MicroBatch mb{tokens.data(), targets.data(), mask.data(), B, T};
  const int64_t count = mb.count_targets();
  const LossSum loss = model.forward_backward(mb, 1.0f / static_cast<float>(count));  // gradient of the mean
  std::vector<float> logits(B * T * cfg.vocab_size);
  model.logits(mb, logits.data());

  save_hf_model(model.store(), model.config(), out, dt);
  const std::vector<float> g = model.grads_to_host();
  std::vector<TensorData> grads;
  for (const auto& t : model.tensors()) grads.push_back(from_f32_vector(t.name, t.shape, g.data() + t.offset, DType::F32));
  write_safetensors(out + "/grads.safetensors", grads);
  write_safetensors(out + "/logits.safetensors", {from_f32_vector("logits", {B, T, cfg.vocab_size}, logits.data(), DType::F32)});
  json batch = {{"B", B}, {"T", T}, {"tokens", tokens}, {"targets", targets}, {"mask", mask}, {"loss", loss.mean()},
                {"precision", argv[3]}};
  write_text_file_atomic(out + "/batch.json", batch.dump() + "\n");
  std::printf("loss %.6f over %lld targets\n", loss.mean(), (long long)count);
  return 0;
}
