// SentencePiece tokenizer (T5's spiece.model, LLaMA's tokenizer.model, or one trained by
// `multinorm data train-tokenizer`).
#pragma once
#include <memory>
#include <string>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace multinorm {

class Tokenizer {
 public:
  explicit Tokenizer(const std::string& model_path);
  ~Tokenizer();
  std::vector<int32_t> encode(const std::string& text) const;  // thread-safe
  std::string decode(const std::vector<int32_t>& ids) const;
  std::string piece(int32_t id) const;
  int32_t vocab_size() const;
  int32_t eos_id() const;  // -1 when the model has none
  int32_t pad_id() const;  // -1 when the model has none
  int32_t bos_id() const;

 private:
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
};

}  // namespace multinorm
