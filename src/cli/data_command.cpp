// `multinorm data`: train-tokenizer, tokenize, inspect, verify (implementations in data_tools/).
#include <CLI/CLI.hpp>

#include <cstdio>

#include "multinorm/cli.h"
#include "multinorm/data_tools.h"

namespace multinorm {

void add_data_command(CLI::App& app) {
  auto* data = app.add_subcommand("data", "Tokenizer training, C4 json.gz -> token shards, shard inspection");
  data->footer("Example: multinorm data tokenize -i 'c4/en/c4-train.*.json.gz,c4/en/c4-validation.*.json.gz' -t data/c4/t5_spiece.model -o data/c4/shards");
  data->require_subcommand(1);

  auto* tt = data->add_subcommand("train-tokenizer", "Train a SentencePiece model on C4-format files");
  tt->footer("Example: multinorm data train-tokenizer --input 'c4/en/c4-train.0000*.json.gz' --out data/c4/my_tokenizer --vocab-size 8192");
  static TrainTokenizerOptions t;
  tt->add_option("--input,-i", t.inputs, "comma-separated globs of C4 json.gz files")->required();
  tt->add_option("--out,-o", t.out_prefix, "output prefix: writes PREFIX.model and PREFIX.vocab")->required();
  tt->add_option("--vocab-size", t.vocab_size, "pieces");
  tt->add_option("--model-type", t.model_type, "bpe or unigram");
  tt->add_option("--max-sentences", t.max_sentences, "paragraphs used for training");
  tt->add_option("--threads", t.threads, "trainer threads (0: all cores)");
  tt->callback([] { train_tokenizer(t); });

  auto* tk = data->add_subcommand("tokenize", "C4 json.gz files -> token shards (resumable)");
  tk->footer("Example: multinorm data tokenize -i 'c4/en/c4-train.*.json.gz,c4/en/c4-validation.*.json.gz' -t data/c4/t5_spiece.model -o data/c4/shards");
  static TokenizeOptions k;
  tk->add_option("--input,-i", k.inputs, "comma-separated globs of C4 json.gz files")->required();
  tk->add_option("--tokenizer,-t", k.tokenizer, "SentencePiece model")->required();
  tk->add_option("--out,-o", k.out_dir, "output directory")->required();
  tk->add_option("--layout", k.layout, "rows (one document per row, the paper) or stream (packed)")
      ->check(CLI::IsMember({"rows", "stream"}));
  tk->add_option("--seq-len", k.seq_len, "rows layout: tokens per row (EOS kept last when truncated)");
  tk->add_option("--max-bad-lines", k.max_bad_lines, "malformed records tolerated before failing");
  tk->add_option("--threads", k.threads, "threads (0: all cores)");
  tk->add_option("--file-workers", k.file_workers, "files tokenized at once, sharing the threads (0: one per 2 cores)");
  tk->add_flag("--overwrite", k.overwrite,
               "rebuild existing shards made from another input, tokenizer, layout or seq_len (default: refuse)");
  static bool no_word_cache = false;  // a plain flag: CLI11 renders a negated one as "{false}"
  tk->add_flag("--no-word-cache", no_word_cache,
               "encode every document whole with SentencePiece (the word cache gives the same ids, faster)");
  tk->callback([] {
    k.word_cache = !no_word_cache;
    const TokenizeStats s = tokenize_files(k);
    if (s.files == 0) {
      std::printf("all %lld shard(s) already complete in %s: nothing to do\n", (long long)s.skipped_files,
                  k.out_dir.c_str());
      return;
    }
    std::printf("tokenized %lld file(s) (%lld already complete): %lld documents, %lld tokens, %lld truncated, "
                "%lld empty, %lld malformed; %.1f MB of text in %.1f s (%.1f MB/s)\n",
                (long long)s.files, (long long)s.skipped_files, (long long)s.documents, (long long)s.tokens,
                (long long)s.truncated, (long long)s.empty, (long long)s.malformed, s.text_bytes / 1e6, s.seconds,
                s.text_bytes / 1e6 / std::max(s.seconds, 1e-9));
    if (s.cache_hits + s.cache_misses > 0)
      std::printf("word cache: %.1f%% of %lld segments found\n", 100.0 * s.cache_hits / (s.cache_hits + s.cache_misses),
                  (long long)(s.cache_hits + s.cache_misses));
  });

  auto* in = data->add_subcommand("inspect", "Header, counts, token histogram, decoded first documents");
  in->footer("Example: multinorm data inspect data/c4/shards/c4-validation.00000-of-00008.tok -t data/c4/t5_spiece.model");
  static std::string shard, tokenizer;
  static int64_t docs = 2;
  in->add_option("shard", shard, "shard file")->required();
  in->add_option("--tokenizer,-t", tokenizer, "SentencePiece model, to decode");
  in->add_option("--docs", docs, "documents to decode");
  in->callback([] { inspect_shard(shard, tokenizer, docs); });

  auto* ve = data->add_subcommand("verify", "Check shards' sizes, checksums and token ids");
  ve->footer("Example: multinorm data verify 'data/c4/shards/*.tok'");
  static std::string globs;
  ve->add_option("shards", globs, "comma-separated globs")->required();
  ve->callback([] { verify_shards(globs); });
}

}  // namespace multinorm
