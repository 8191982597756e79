// `multinorm data tokenize`: C4 json.gz files -> token shards (include/multinorm/shard.h).
// Streaming with bounded memory (batches of lines), documents encoded in parallel on all cores and
// written in input order; resumable (an existing complete shard is skipped; a shard is written to a
// temporary file and renamed). Per document: encode, append EOS; rows layout truncates to seq_len
// keeping EOS last. Malformed lines and records without "text" are reported with file:line and fail
// the run above max_bad_lines; empty documents are skipped and counted.
#include <omp.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdio>

#include "multinorm/c4_reader.h"
#include "multinorm/data_tools.h"
#include "multinorm/error.h"
#include "multinorm/shard.h"
#include "multinorm/tokenizer.h"

namespace multinorm {

std::string shard_name_for(const std::string& input) {
  const auto slash = input.find_last_of('/');
  std::string base = slash == std::string::npos ? input : input.substr(slash + 1);
  for (const std::string ext : {".json.gz", ".jsonl.gz", ".json", ".jsonl", ".gz"})
    if (base.size() > ext.size() && base.compare(base.size() - ext.size(), ext.size(), ext) == 0) {
      base.resize(base.size() - ext.size());
      break;
    }
  return base + ".tok";
}

static bool complete_shard(const std::string& path) {
  try {
    read_shard_header(path);
    return true;
  } catch (const Error&) {
    return false;
  }
}

TokenizeStats tokenize_files(const TokenizeOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<std::string> inputs = expand_globs(o.inputs);
  const Tokenizer tok(o.tokenizer);
  const ShardLayout layout = parse_layout(o.layout);
  if (tok.eos_id() < 0) throw Error(o.tokenizer + ": the tokenizer has no EOS piece");
  ::mkdir(o.out_dir.c_str(), 0755);
  omp_set_num_threads(o.threads > 0 ? o.threads : omp_get_num_procs());
  // One word cache per thread, kept across batches and files (words repeat across documents).
  std::vector<WordCache> caches(static_cast<size_t>(omp_get_max_threads()));
  WordCache* const no_cache = nullptr;
  const bool use_cache = o.word_cache && tok.word_cache_exact();
  if (!o.quiet)
    std::fprintf(stderr, "tokenize: word cache %s\n",
                 use_cache ? "on (exact for this BPE model)"
                 : o.word_cache ? ("off: " + tok.word_cache_why_not()).c_str()
                                : "off (--no-word-cache)");
  TokenizeStats st;
  constexpr size_t kBatch = 512;
  std::vector<std::string> lines(kBatch);
  std::vector<int64_t> line_no(kBatch);
  std::vector<std::vector<int32_t>> ids(kBatch);
  std::vector<int8_t> status(kBatch);  // 0 ok, 1 empty, 2 malformed
  std::vector<size_t> raw_size(kBatch);
  for (const auto& in : inputs) {
    const std::string out = o.out_dir + "/" + shard_name_for(in);
    st.outputs.push_back(out);
    if (complete_shard(out)) {
      ++st.skipped_files;
      continue;
    }
    struct stat s {};
    if (::stat(in.c_str(), &s) == 0) st.input_bytes += s.st_size;
    C4Reader reader(in);
    ShardWriter writer(out, static_cast<uint32_t>(tok.vocab_size()), tok.eos_id(), tok.pad_id(), layout,
                       static_cast<uint32_t>(o.seq_len));
    while (true) {
      size_t n = 0;
      while (n < kBatch && reader.next_line(lines[n], line_no[n])) {
        raw_size[n] = lines[n].size();
        ++n;
      }
      if (n == 0) break;
      // One document per task: document sizes vary by 1000x, larger chunks leave a core idle.
#pragma omp parallel for schedule(dynamic, 1)
      for (size_t i = 0; i < n; ++i) {
        std::string text;
        if (!parse_c4_line(lines[i], text)) {
          status[i] = lines[i].find_first_not_of(" \t\r") == std::string::npos ? 1 : 2;  // blank line: empty
          continue;
        }
        if (text.empty()) {
          status[i] = 1;
          continue;
        }
        status[i] = 0;
        ids[i] = tok.encode(text, use_cache ? &caches[static_cast<size_t>(omp_get_thread_num())] : no_cache);
        ids[i].push_back(tok.eos_id());
        lines[i].swap(text);  // keep the text length for the stats
      }
      for (size_t i = 0; i < n; ++i) st.json_bytes += static_cast<int64_t>(raw_size[i]) + 1;
      for (size_t i = 0; i < n; ++i) {
        if (status[i] == 2) {
          ++st.malformed;
          std::fprintf(stderr, "%s:%lld: malformed record (not a JSON object with a string \"text\")\n", in.c_str(),
                       (long long)line_no[i]);
          if (st.malformed > o.max_bad_lines)
            throw Error(in + ":" + std::to_string(line_no[i]) + ": more than " + std::to_string(o.max_bad_lines) +
                        " malformed records; stopping");
          continue;
        }
        if (status[i] == 1) {
          ++st.empty;
          continue;
        }
        if (layout == ShardLayout::Rows && ids[i].size() > static_cast<size_t>(o.seq_len)) ++st.truncated;
        writer.add_document(ids[i]);
        ++st.documents;
        st.text_bytes += static_cast<int64_t>(lines[i].size());
      }
    }
    writer.finish();
    st.tokens += static_cast<int64_t>(writer.header().num_tokens);
    ++st.files;
    if (!o.quiet)
      std::fprintf(stderr, "tokenize: %s -> %s (%llu documents, %llu tokens)\n", in.c_str(), out.c_str(),
                   (unsigned long long)writer.header().num_docs, (unsigned long long)writer.header().num_tokens);
  }
  for (const WordCache& c : caches) {
    st.cache_hits += static_cast<int64_t>(c.hits());
    st.cache_misses += static_cast<int64_t>(c.misses());
  }
  st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return st;
}

}  // namespace multinorm
