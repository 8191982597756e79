// `multinorm bench data`: tokenize throughput against Debian's spm_encode CLI on the same text, and
// loader throughput, both measured in the same run.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "multinorm/bench.h"
#include "multinorm/c4_reader.h"
#include "multinorm/checksum.h"
#include "multinorm/data_tools.h"
#include "multinorm/error.h"
#include "multinorm/loader.h"

namespace multinorm {

void bench_data(const DataBenchOptions& o) {
  using Clock = std::chrono::steady_clock;
  char tmpl[] = "/tmp/multinorm-bench-XXXXXX";
  const std::string dir = ::mkdtemp(tmpl) ? tmpl : throw Error("bench data: cannot create a temporary directory");
  // The same text for spm_encode: every document's text, its paragraphs one per line.
  int64_t json_bytes = 0;
  {
    std::ofstream out(dir + "/text.txt", std::ios::binary);
    std::string line, text;
    int64_t no = 0;
    for (const auto& in : expand_globs(o.inputs)) {
      C4Reader r(in);
      while (r.next_line(line, no)) {
        json_bytes += static_cast<int64_t>(line.size()) + 1;
        if (parse_c4_line(line, text)) out << text << "\n";
      }
    }
  }
  auto t0 = Clock::now();
  const std::string cmd = "spm_encode --model='" + o.tokenizer + "' --output_format=id < '" + dir + "/text.txt' > /dev/null 2>&1";
  const int rc = std::system(cmd.c_str());
  const double spm_s = std::chrono::duration<double>(Clock::now() - t0).count();

  // The same job four ways: where the speed comes from (threads, word cache), and a check that the
  // word cache changed no id (the shards of the cached and uncached runs must be byte-identical).
  struct Variant {
    const char* name;
    int threads;
    bool word_cache;
    TokenizeStats stats;
  };
  std::vector<Variant> variants = {{"1 thread, documents encoded whole", 1, false, {}},
                                   {"1 thread, word cache", 1, true, {}},
                                   {"all cores, documents encoded whole", 0, false, {}},
                                   {"all cores, word cache (the default)", 0, true, {}}};
  for (size_t v = 0; v < variants.size(); ++v) {
    TokenizeOptions k;
    k.inputs = o.inputs;
    k.tokenizer = o.tokenizer;
    k.out_dir = dir + "/shards" + std::to_string(v);
    k.layout = "stream";
    k.threads = variants[v].threads;
    k.word_cache = variants[v].word_cache;
    k.quiet = true;
    variants[v].stats = tokenize_files(k);
  }
  const TokenizeStats& st = variants.back().stats;
  bool identical = true;
  for (size_t f = 0; f < st.outputs.size(); ++f)
    identical = identical && std::system(("cmp -s '" + variants[2].stats.outputs[f] + "' '" + st.outputs[f] + "'").c_str()) == 0;

  // Loader: micro-batches of 16 x 256 from the shards just written, shuffled, with prefetch.
  auto data = std::make_shared<const ShardSet>(st.outputs, 256, 1 << 30);
  LoaderOptions lo;
  lo.micro_batch = 16;
  int64_t tokens = 0;
  t0 = Clock::now();
  {
    TrainLoader loader(data, lo);
    while (std::chrono::duration<double>(Clock::now() - t0).count() < 2.0) tokens += loader.next().count;
  }
  const double loader_s = std::chrono::duration<double>(Clock::now() - t0).count();
  std::system(("rm -rf '" + dir + "'").c_str());

  std::printf("bench data: %.1f MB of C4 JSON (%lld documents, %lld tokens), %d cores\n", json_bytes / 1e6,
              (long long)st.documents, (long long)st.tokens, static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN)));
  if (rc == 0)
    std::printf("  %-46s %6.2f s %6.1f MB/s  (baseline)\n", "spm_encode (Debian CLI), same text", spm_s,
                json_bytes / 1e6 / spm_s);
  else
    std::printf("  spm_encode: not available (apt-get install sentencepiece)\n");
  for (const Variant& v : variants) {
    std::printf("  %-46s %6.2f s %6.1f MB/s", (std::string("tokenize, ") + v.name).c_str(), v.stats.seconds,
                json_bytes / 1e6 / v.stats.seconds);
    if (rc == 0) std::printf("  %.2fx spm_encode", spm_s / v.stats.seconds);
    if (v.stats.cache_hits + v.stats.cache_misses > 0)
      std::printf(", %.1f%% of segments cached",
                  100.0 * v.stats.cache_hits / (v.stats.cache_hits + v.stats.cache_misses));
    std::printf("\n");
  }
  std::printf("  word cache ids identical to whole-document encoding: %s\n", identical ? "yes" : "NO");
  std::printf("  loader: %.0f tokens/s (16 x 256 micro-batches, shuffled, prefetch) = %.0fx a %.0f tokens/s trainer\n",
              tokens / loader_s, tokens / loader_s / o.train_tokens_per_s, o.train_tokens_per_s);
}

}  // namespace multinorm

namespace multinorm {

void bench_checksum(int64_t bytes) {
  std::vector<char> src(static_cast<size_t>(bytes)), dst(static_cast<size_t>(bytes));
  for (size_t i = 0; i < src.size(); i += 4096) src[i] = static_cast<char>(i * 31);  // touch every page
  std::fill(dst.begin(), dst.end(), 1);
  auto best_of = [](int n, const std::function<void()>& f) {
    double best = 1e30;
    for (int r = 0; r < n; ++r) {
      const auto t = std::chrono::steady_clock::now();
      f();
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count());
    }
    return best;
  };
  uint32_t crc = 0;
  const double t_crc = best_of(3, [&] { crc = crc32c(0, src.data(), src.size()); });
  const double t_copy = best_of(3, [&] { std::memcpy(dst.data(), src.data(), src.size()); });
  std::printf("crc32c over %.2f GB: %.3f s, %.2f GB/s (one core); memcpy of the same bytes: %.2f GB/s (read + write); crc/copy time %.2f  [%08x]\n",
              bytes / 1e9, t_crc, bytes / 1e9 / t_crc, bytes / 1e9 / t_copy, t_crc / t_copy, crc);
}

}  // namespace multinorm
