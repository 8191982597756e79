// `multinorm data tokenize`: C4 json.gz files -> token shards (include/multinorm/shard.h).
// Streaming with bounded memory (batches of lines); parallel over files (file workers, each reading
// and decompressing its own file) and over the documents of a file (OpenMP threads of that worker),
// documents written in input order; resumable (an existing complete shard is skipped; a shard is
// written to a temporary file and renamed). Per document: encode, append EOS; rows layout truncates
// to seq_len keeping EOS last. Malformed lines and records without "text" are reported with file:line
// and fail the run above max_bad_lines (over all files); empty documents are skipped and counted.
#include <omp.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <exception>
#include <mutex>
#include <thread>

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

namespace {

FileStamp stat_input(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw Error(path + ": cannot stat the input file");
  return file_stamp(path);
}

// How an existing complete shard differs from what this run would write ("" when it does not).
std::string shard_difference(const ShardHeader& h, const TokenizeOptions& o, ShardLayout layout, uint64_t tokenizer_hash,
                             const FileStamp& in) {
  std::string d;
  auto add = [&](const std::string& s) { d += (d.empty() ? "" : "; ") + s; };
  if (h.version < 2) return "written by an older multinorm that recorded no provenance";
  if (h.layout != layout) add(std::string("layout ") + layout_name(h.layout) + ", asked " + layout_name(layout));
  if (layout == ShardLayout::Rows && h.layout == layout && h.seq_len != static_cast<uint64_t>(o.seq_len))
    add("seq_len " + std::to_string(h.seq_len) + ", asked " + std::to_string(o.seq_len));
  if (h.tokenizer_hash != tokenizer_hash) add("made with another tokenizer than " + o.tokenizer);
  if (h.input_bytes != in.bytes || h.input_mtime_ns != in.mtime_ns)
    add("its input changed since (size " + std::to_string(h.input_bytes) + " -> " + std::to_string(in.bytes) +
        (h.input_mtime_ns != in.mtime_ns ? ", modification time differs" : "") + ")");
  return d;
}

}  // namespace

namespace {

// What the file workers share: the tokenizer (thread-safe), the options, and the run's totals.
struct TokenizeJob {
  const TokenizeOptions& o;
  const Tokenizer& tok;
  ShardLayout layout;
  bool use_cache;
  uint64_t tokenizer_hash;
  std::mutex mu;  // guards st, the progress and stderr reports
  TokenizeStats st;
  // Progress: compressed input bytes to read and read (by finished files and the ones in flight).
  int64_t files_todo = 0, files_done = 0, bytes_todo = 0, bytes_read = 0;
  std::chrono::steady_clock::time_point t0{}, last_report{};
};

std::string hms(double seconds) {
  const long s = static_cast<long>(seconds + 0.5);
  char text[32];
  std::snprintf(text, sizeof(text), "%ld:%02ld:%02ld", s / 3600, s / 60 % 60, s % 60);
  return text;
}

// "[3/1024 files, 0.95 of 326.78 GB, 11.2 MB/s, ETA 8:05:12]": the rate and the ETA in compressed
// bytes, what the files on disk measure. Under job.mu.
std::string progress(TokenizeJob& job) {
  const auto now = std::chrono::steady_clock::now();
  job.last_report = now;
  const double s = std::chrono::duration<double>(now - job.t0).count(), rate = job.bytes_read / std::max(s, 1e-9);
  const bool gb = job.bytes_todo >= 1e9;
  char text[160];
  std::snprintf(text, sizeof(text), "[%lld/%lld files, %.2f of %.2f %s, %.1f MB/s, ETA %s]", (long long)job.files_done,
                (long long)job.files_todo, job.bytes_read / (gb ? 1e9 : 1e6), job.bytes_todo / (gb ? 1e9 : 1e6), gb ? "GB" : "MB",
                rate / 1e6, job.bytes_read > 0 ? hms((job.bytes_todo - job.bytes_read) / rate).c_str() : "?");
  return text;
}

// One input file -> one shard, its documents encoded by `threads` OpenMP threads, each with its own
// word cache (caches[thread], kept across files: words repeat across documents).
void tokenize_file(TokenizeJob& job, const std::string& in, const std::string& out, int threads,
                   std::vector<WordCache>& caches) {
  const TokenizeOptions& o = job.o;
  constexpr size_t kBatch = 512;
  std::vector<std::string> lines(kBatch);
  std::vector<int64_t> line_no(kBatch);
  std::vector<std::vector<int32_t>> ids(kBatch);
  std::vector<int8_t> status(kBatch);  // 0 ok, 1 empty, 2 malformed
  std::vector<size_t> raw_size(kBatch);
  TokenizeStats local;  // this file's counts, added to the run's at the end
  const FileStamp input = stat_input(in);  // before reading: a file changing meanwhile is not recorded as read
  C4Reader reader(in);
  ShardWriter writer(out, static_cast<uint32_t>(job.tok.vocab_size()), job.tok.eos_id(), job.tok.pad_id(), job.layout,
                     static_cast<uint32_t>(o.seq_len));
  writer.set_provenance(job.tokenizer_hash, input.bytes, input.mtime_ns);
  int64_t counted = 0;  // compressed bytes of this file added to job.bytes_read
  while (true) {
    size_t n = 0;
    while (n < kBatch && reader.next_line(lines[n], line_no[n])) {
      raw_size[n] = lines[n].size();
      ++n;
    }
    if (n == 0) break;
    if (!o.quiet) {  // a line every 30 s while files are long in the making (a C4 file: minutes)
      std::lock_guard<std::mutex> lock(job.mu);
      const int64_t at = reader.compressed_offset();
      job.bytes_read += at - counted, counted = at;
      if (std::chrono::steady_clock::now() - job.last_report > std::chrono::seconds(30))
        std::fprintf(stderr, "tokenize: %s %s\n", progress(job).c_str(), in.c_str());
    }
    // One document per task: document sizes vary by 1000x, larger chunks leave a core idle.
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
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
      ids[i] = job.tok.encode(text, job.use_cache ? &caches[static_cast<size_t>(omp_get_thread_num())] : nullptr);
      ids[i].push_back(job.tok.eos_id());
      lines[i].swap(text);  // keep the text length for the stats
    }
    for (size_t i = 0; i < n; ++i) local.json_bytes += static_cast<int64_t>(raw_size[i]) + 1;
    for (size_t i = 0; i < n; ++i) {
      if (status[i] == 2) {
        std::lock_guard<std::mutex> lock(job.mu);
        ++job.st.malformed;
        std::fprintf(stderr, "%s:%lld: malformed record (not a JSON object with a string \"text\")\n", in.c_str(),
                     (long long)line_no[i]);
        if (job.st.malformed > o.max_bad_lines)
          throw Error(in + ":" + std::to_string(line_no[i]) + ": more than " + std::to_string(o.max_bad_lines) +
                      " malformed records; stopping");
        continue;
      }
      if (status[i] == 1) {
        ++local.empty;
        continue;
      }
      if (job.layout == ShardLayout::Rows && ids[i].size() > static_cast<size_t>(o.seq_len)) ++local.truncated;
      writer.add_document(ids[i]);
      ++local.documents;
      local.text_bytes += static_cast<int64_t>(lines[i].size());
    }
  }
  writer.finish();
  struct stat s {};
  std::lock_guard<std::mutex> lock(job.mu);
  TokenizeStats& st = job.st;
  if (::stat(in.c_str(), &s) == 0) st.input_bytes += s.st_size;
  job.bytes_read += static_cast<int64_t>(input.bytes) - counted;
  ++job.files_done;
  st.json_bytes += local.json_bytes;
  st.empty += local.empty;
  st.truncated += local.truncated;
  st.documents += local.documents;
  st.text_bytes += local.text_bytes;
  st.tokens += static_cast<int64_t>(writer.header().num_tokens);
  ++st.files;
  if (!o.quiet)
    std::fprintf(stderr, "tokenize: %s %s -> %s (%llu documents, %llu tokens)\n", progress(job).c_str(), in.c_str(), out.c_str(),
                 (unsigned long long)writer.header().num_docs, (unsigned long long)writer.header().num_tokens);
}

}  // namespace

TokenizeStats tokenize_files(const TokenizeOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<std::string> inputs = expand_globs(o.inputs);
  const Tokenizer tok(o.tokenizer);
  if (tok.eos_id() < 0) throw Error(o.tokenizer + ": the tokenizer has no EOS piece");
  ::mkdir(o.out_dir.c_str(), 0755);
  TokenizeJob job{o, tok, parse_layout(o.layout), o.word_cache && tok.word_cache_exact(), file_fingerprint(o.tokenizer),
                  {}, {}};
  if (!o.quiet)
    std::fprintf(stderr, "tokenize: word cache %s\n",
                 job.use_cache    ? "on (exact for this BPE model)"
                 : o.word_cache ? ("off: " + tok.word_cache_why_not()).c_str()
                                : "off (--no-word-cache)");

  std::vector<std::pair<std::string, std::string>> todo;  // (input, output) still to write
  std::string stale;  // existing shards made from something else: refused unless --overwrite
  for (const auto& in : inputs) {
    const std::string out = o.out_dir + "/" + shard_name_for(in);
    job.st.outputs.push_back(out);
    ShardHeader h;
    try {
      h = read_shard_header(out);
    } catch (const Error&) {  // absent, or incomplete/corrupt: (re)written
      todo.emplace_back(in, out);
      continue;
    }
    const std::string diff = shard_difference(h, o, job.layout, job.tokenizer_hash, stat_input(in));
    if (diff.empty()) {
      ++job.st.skipped_files;
    } else if (o.overwrite) {
      if (!o.quiet) std::fprintf(stderr, "tokenize: %s is stale (%s): rebuilding\n", out.c_str(), diff.c_str());
      ++job.st.rebuilt_files;
      todo.emplace_back(in, out);
    } else {
      stale += "\n  " + out + ": " + diff;
    }
  }
  if (!stale.empty())
    throw Error("tokenize: " + o.out_dir + " holds shards made from other inputs or settings:" + stale +
                "\npass --overwrite to rebuild them, or choose another --out directory");
  // Cores are shared between file workers (each decompresses and parses its file serially, and the
  // serial parts of one overlap with the encoding of another) and the document threads of each
  // worker: two threads per worker by default, one worker with every core when there is one file.
  const int cores = o.threads > 0 ? o.threads : omp_get_num_procs();
  const int workers = static_cast<int>(std::max<int64_t>(
      1, std::min<int64_t>(static_cast<int64_t>(todo.size()), o.file_workers > 0 ? o.file_workers : cores / 2)));
  const int threads = std::max(1, cores / workers);
  job.files_todo = static_cast<int64_t>(todo.size());
  for (const auto& [in, out] : todo) job.bytes_todo += static_cast<int64_t>(stat_input(in).bytes);
  job.t0 = job.last_report = std::chrono::steady_clock::now();
  if (!o.quiet && !todo.empty())
    std::fprintf(stderr, "tokenize: %lld file(s) to tokenize (%.1f MB of json.gz), %lld already complete; %d file worker(s) x %d thread(s)\n",
                 (long long)todo.size(), job.bytes_todo / 1e6, (long long)job.st.skipped_files, workers, threads);
  std::atomic<size_t> next{0};
  std::exception_ptr error;
  auto work = [&] {
    std::vector<WordCache> caches(static_cast<size_t>(threads));
    for (size_t f = next++; f < todo.size(); f = next++) {
      try {
        tokenize_file(job, todo[f].first, todo[f].second, threads, caches);
      } catch (...) {
        std::lock_guard<std::mutex> lock(job.mu);
        if (!error) error = std::current_exception();
        next = todo.size();  // the others stop after their current file
      }
    }
    std::lock_guard<std::mutex> lock(job.mu);
    for (const WordCache& c : caches) {
      job.st.cache_hits += static_cast<int64_t>(c.hits());
      job.st.cache_misses += static_cast<int64_t>(c.misses());
    }
  };
  std::vector<std::thread> pool;
  for (int w = 1; w < workers; ++w) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
  job.st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return job.st;
}

}  // namespace multinorm
