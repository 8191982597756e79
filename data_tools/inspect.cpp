// `multinorm data inspect` and `multinorm data verify`.
#include <algorithm>
#include <cstdio>
#include <map>

#include "multinorm/c4_reader.h"
#include "multinorm/data_tools.h"
#include "multinorm/shard.h"
#include "multinorm/tokenizer.h"

namespace multinorm {

void inspect_shard(const std::string& path, const std::string& tokenizer, int64_t docs) {
  const Shard s(path);
  const ShardHeader& h = s.header();
  std::printf("%s: multinorm shard v%u, layout %s, vocab %u (%u-byte ids), eos %d, pad %d, seq_len %u\n", path.c_str(),
              h.version, layout_name(h.layout), h.vocab_size, h.token_bytes, h.eos_id, h.pad_id, h.seq_len);
  std::printf("  %llu documents, %llu tokens, crc32 %08x (verified)\n", (unsigned long long)h.num_docs,
              (unsigned long long)h.num_tokens, h.crc32);
  if (h.layout == ShardLayout::Rows && h.num_docs) {
    uint64_t full = 0, min_len = ~0ull, max_len = 0;
    for (uint64_t i = 0; i < h.num_docs; ++i) {
      full += s.row_length(i) == h.seq_len;
      min_len = std::min<uint64_t>(min_len, s.row_length(i));
      max_len = std::max<uint64_t>(max_len, s.row_length(i));
    }
    std::printf("  row lengths: min %llu, mean %.1f, max %llu; %.1f%% reach seq_len (truncated or exact)\n",
                (unsigned long long)min_len, double(h.num_tokens) / h.num_docs, (unsigned long long)max_len,
                100.0 * full / h.num_docs);
  }
  std::map<uint32_t, uint64_t> counts;
  for (uint64_t i = 0; i < h.num_tokens; ++i) ++counts[s.token(i)];
  std::vector<std::pair<uint64_t, uint32_t>> top;
  for (const auto& [id, c] : counts) top.push_back({c, id});
  std::sort(top.rbegin(), top.rend());
  std::unique_ptr<Tokenizer> tok;
  if (!tokenizer.empty()) tok = std::make_unique<Tokenizer>(tokenizer);
  std::printf("  %zu distinct ids (%.1f%% of the vocabulary); most frequent:", counts.size(), 100.0 * counts.size() / h.vocab_size);
  for (size_t i = 0; i < std::min<size_t>(10, top.size()); ++i)
    std::printf(" %u%s%s%s (%.2f%%)", top[i].second, tok ? " '" : "", tok ? tok->piece(top[i].second).c_str() : "", tok ? "'" : "",
                100.0 * top[i].first / h.num_tokens);
  std::printf("\n");
  if (tok && h.layout == ShardLayout::Rows)
    for (int64_t d = 0; d < std::min<int64_t>(docs, static_cast<int64_t>(h.num_docs)); ++d) {
      std::vector<int32_t> ids;
      for (uint32_t t = 0; t < s.row_length(d); ++t) ids.push_back(static_cast<int32_t>(s.token(s.row_start(d) + t)));
      std::string text = tok->decode(ids);
      if (text.size() > 300) text = text.substr(0, 300) + "...";
      std::printf("  [doc %lld, %zu tokens] %s\n", (long long)d, ids.size(), text.c_str());
    }
}

void verify_shards(const std::string& globs) {
  int n = 0;
  for (const auto& path : expand_globs(globs)) {
    const Shard s(path, true);
    std::printf("%s: OK (%llu documents, %llu tokens, crc32 %08x)\n", path.c_str(), (unsigned long long)s.header().num_docs,
                (unsigned long long)s.header().num_tokens, s.header().crc32);
    ++n;
  }
  std::printf("%d shard(s) verified\n", n);
}

}  // namespace multinorm
