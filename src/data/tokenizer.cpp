#include "multinorm/tokenizer.h"

#include <sentencepiece_processor.h>

#include "multinorm/error.h"

namespace multinorm {

Tokenizer::Tokenizer(const std::string& model_path) : sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {
  const auto status = sp_->Load(model_path);
  if (!status.ok()) throw Error(model_path + ": cannot load SentencePiece model: " + status.ToString());
}
Tokenizer::~Tokenizer() = default;

std::vector<int32_t> Tokenizer::encode(const std::string& text) const {
  std::vector<int> ids;
  const auto status = sp_->Encode(text, &ids);
  if (!status.ok()) throw Error("tokenizer: " + status.ToString());
  return std::vector<int32_t>(ids.begin(), ids.end());
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  sp_->Decode(std::vector<int>(ids.begin(), ids.end()), &out);
  return out;
}

std::string Tokenizer::piece(int32_t id) const { return sp_->IdToPiece(id); }
int32_t Tokenizer::vocab_size() const { return sp_->GetPieceSize(); }
int32_t Tokenizer::eos_id() const { return sp_->eos_id(); }
int32_t Tokenizer::pad_id() const { return sp_->pad_id(); }
int32_t Tokenizer::bos_id() const { return sp_->bos_id(); }

}  // namespace multinorm
