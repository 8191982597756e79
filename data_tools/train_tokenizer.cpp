// `multinorm data train-tokenizer`: SentencePiece training (libsentencepiece's trainer) on C4-format
// files, with LLaMA-like settings: byte fallback, split digits, identity normalisation, whitespace
// kept, unk 0 / bos 1 / eos 2, no pad. Each paragraph of each document is one training sentence.
#include <sentencepiece_trainer.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "multinorm/c4_reader.h"
#include "multinorm/data_tools.h"
#include "multinorm/error.h"
#include "multinorm/tokenizer.h"

namespace multinorm {

void train_tokenizer(const TrainTokenizerOptions& o) {
  if (o.model_type != "bpe" && o.model_type != "unigram")
    throw ConfigError("--model-type: expected bpe or unigram, got '" + o.model_type + "'");
  const std::string corpus = o.out_prefix + ".sentences.tmp";
  int64_t sentences = 0, docs = 0;
  {
    std::ofstream out(corpus, std::ios::binary);
    if (!out) throw Error(corpus + ": cannot create");
    std::string line, text;
    int64_t no = 0;
    for (const auto& in : expand_globs(o.inputs)) {
      C4Reader reader(in);
      while (sentences < o.max_sentences && reader.next_line(line, no)) {
        if (!parse_c4_line(line, text)) continue;
        ++docs;
        size_t start = 0;
        while (start < text.size()) {
          size_t end = text.find('\n', start);
          if (end == std::string::npos) end = text.size();
          if (end > start) {
            out.write(text.data() + start, static_cast<std::streamsize>(end - start)).put('\n');
            ++sentences;
          }
          start = end + 1;
        }
      }
    }
  }
  const std::string args =
      "--input=" + corpus + " --model_prefix=" + o.out_prefix + " --vocab_size=" + std::to_string(o.vocab_size) +
      " --model_type=" + o.model_type +
      " --byte_fallback=true --split_digits=true --normalization_rule_name=identity"
      " --remove_extra_whitespaces=false --character_coverage=0.9999 --unk_id=0 --bos_id=1 --eos_id=2 --pad_id=-1"
      " --max_sentence_length=16384 --shuffle_input_sentence=true --minloglevel=1 --num_threads=" +
      std::to_string(o.threads > 0 ? o.threads : static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN)));
  const auto status = sentencepiece::SentencePieceTrainer::Train(args);
  std::remove(corpus.c_str());
  if (!status.ok()) throw Error("train-tokenizer: " + status.ToString());
  // Report.
  const Tokenizer tok(o.out_prefix + ".model");
  std::printf("tokenizer: %s.model (%s, %d pieces; unk %d, bos %d, eos %d, pad %d), vocabulary in %s.vocab\n",
              o.out_prefix.c_str(), o.model_type.c_str(), tok.vocab_size(), 0, tok.bos_id(), tok.eos_id(), tok.pad_id(),
              o.out_prefix.c_str());
  std::printf("trained on %lld sentences from %lld documents\n", (long long)sentences, (long long)docs);
  const std::string sample = "Hello world, this is a test of the tokenizer: 12345 tokens.";
  const auto ids = tok.encode(sample);
  std::printf("sample: \"%s\" -> %zu tokens:", sample.c_str(), ids.size());
  for (auto id : ids) std::printf(" %s", tok.piece(id).c_str());
  std::printf("\n");
}

}  // namespace multinorm
