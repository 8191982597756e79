// The data tools behind `multinorm data ...` (sources in data_tools/): SentencePiece training, C4
// json.gz -> token shards, shard inspection and verification.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace multinorm {

struct TokenizeOptions {
  std::string inputs;      // comma-separated globs of C4 json.gz files
  std::string tokenizer;   // SentencePiece model
  std::string out_dir;
  std::string layout = "rows";
  int64_t seq_len = 256;
  int64_t max_bad_lines = 100;  // malformed lines tolerated (each reported) before the run fails
  int threads = 0;       // cores to use (0: all)
  int file_workers = 0;  // files tokenized at once, sharing the cores (0: one per 2 cores)
  bool word_cache = true;  // memoise word encodings where exact (Tokenizer::word_cache_exact)
  bool overwrite = false;  // rebuild shards made from other inputs or settings instead of refusing
  bool quiet = false;
};

struct TokenizeStats {
  int64_t files = 0, skipped_files = 0;  // skipped: already complete from the same input and settings
  int64_t rebuilt_files = 0;             // stale shards rebuilt (--overwrite)
  int64_t documents = 0, empty = 0, malformed = 0, tokens = 0, truncated = 0;
  int64_t input_bytes = 0;  // compressed
  int64_t text_bytes = 0;
  int64_t json_bytes = 0;  // uncompressed input lines
  int64_t cache_hits = 0, cache_misses = 0;  // word cache: segments found / encoded
  double seconds = 0;
  std::vector<std::string> outputs;
};

TokenizeStats tokenize_files(const TokenizeOptions& o);
// Output shard name for an input: c4-train.00000-of-01024.json.gz -> c4-train.00000-of-01024.tok
std::string shard_name_for(const std::string& input);

struct TrainTokenizerOptions {
  std::string inputs;           // comma-separated globs of C4 json.gz files
  std::string out_prefix;       // writes <prefix>.model and <prefix>.vocab
  int64_t vocab_size = 8192;
  std::string model_type = "bpe";  // bpe | unigram
  int64_t max_sentences = 2000000;
  int threads = 0;
};
void train_tokenizer(const TrainTokenizerOptions& o);

void inspect_shard(const std::string& path, const std::string& tokenizer, int64_t docs);
void verify_shards(const std::string& globs);

}  // namespace multinorm
