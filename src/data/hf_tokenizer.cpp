// Tokenizer files of an exported Hugging Face directory (include/multinorm/hf_tokenizer.h).
#include "multinorm/hf_tokenizer.h"

#include <filesystem>

#include "multinorm/error.h"
#include "multinorm/json_file.h"
#include "multinorm/tokenizer.h"

namespace multinorm {

namespace {
json id_or_null(int32_t id) { return id >= 0 ? json(id) : json(nullptr); }
json piece_or_null(const Tokenizer& tok, int32_t id) { return id >= 0 ? json(tok.piece(id)) : json(nullptr); }
}  // namespace

void write_hf_tokenizer(const std::string& tokenizer_model, const std::string& dir, int64_t model_vocab, int64_t max_length) {
  const Tokenizer tok(tokenizer_model);
  if (tok.vocab_size() > model_vocab)
    throw Error(tokenizer_model + ": " + std::to_string(tok.vocab_size()) + " pieces, more than the model's " + std::to_string(model_vocab) +
                " embeddings: not the tokenizer this model was trained with");
  std::error_code ec;
  std::filesystem::copy_file(tokenizer_model, dir + "/tokenizer.model", std::filesystem::copy_options::overwrite_existing, ec);
  if (ec) throw Error(tokenizer_model + ": cannot copy to " + dir + "/tokenizer.model: " + ec.message());

  const int32_t bos = tok.bos_id(), eos = tok.eos_id(), pad = tok.pad_id(), unk = tok.unk_id();
  const json specials = {{"bos_token", piece_or_null(tok, bos)}, {"eos_token", piece_or_null(tok, eos)},
                         {"unk_token", piece_or_null(tok, unk)}, {"pad_token", piece_or_null(tok, pad)}};
  json config = specials;
  config.update({{"tokenizer_class", "LlamaTokenizer"},
                 {"add_bos_token", false},  // training never saw a BOS
                 {"add_eos_token", false},
                 {"legacy", true},  // SentencePiece's Encode as is, as `data tokenize` called it
                 {"clean_up_tokenization_spaces", false},
                 {"model_max_length", max_length},
                 {"sp_model_kwargs", json::object()}});
  write_text_file_atomic(dir + "/tokenizer_config.json", config.dump(2) + "\n");
  json map = json::object();
  for (const auto& [k, v] : specials.items())
    if (!v.is_null()) map[k] = v;
  write_text_file_atomic(dir + "/special_tokens_map.json", map.dump(2) + "\n");

  const json ids = {{"bos_token_id", id_or_null(bos)}, {"eos_token_id", id_or_null(eos)}, {"pad_token_id", id_or_null(pad >= 0 ? pad : eos)}};
  json generation = ids;
  generation.update({{"do_sample", true}, {"temperature", 0.8}, {"top_k", 40}});  // `multinorm generate`'s defaults
  write_text_file_atomic(dir + "/generation_config.json", generation.dump(2) + "\n");
  json model_config = read_json_file(dir + "/config.json");
  model_config.update(ids);
  write_text_file_atomic(dir + "/config.json", model_config.dump(2) + "\n");
}

}  // namespace multinorm
