// The tokenizer half of a Hugging Face model directory (`multinorm export`), so that
// AutoTokenizer, generate() and lm-evaluation-harness read the text as training did.
#pragma once
#include <cstdint>
#include <string>

namespace multinorm {

// Writes into `dir` (which holds model.safetensors and config.json):
//   tokenizer.model          the SentencePiece model, copied byte for byte
//   tokenizer_config.json    LlamaTokenizer (SentencePiece's own encoding, legacy), adding neither
//                            BOS nor EOS: training saw each document's pieces, then EOS
//   special_tokens_map.json  the pieces of the special ids
//   generation_config.json   the special ids, and stopping at EOS
// and adds bos/eos/pad_token_id to config.json. The ids are the tokenizer's own (T5's spiece.model:
// pad 0, EOS 1, unk 2, no BOS), the ones its shards recorded. `model_vocab`: the model's embedding
// rows, at least the tokenizer's pieces.
void write_hf_tokenizer(const std::string& tokenizer_model, const std::string& dir, int64_t model_vocab, int64_t max_length);

}  // namespace multinorm
