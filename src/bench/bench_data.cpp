// `multinorm bench data`: tokenize throughput against Debian's spm_encode CLI on the same text, and
// loader throughput, both measured in the same run.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "multinorm/bench.h"
#include "multinorm/c4_reader.h"
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

  TokenizeOptions k;
  k.inputs = o.inputs;
  k.tokenizer = o.tokenizer;
  k.out_dir = dir + "/shards";
  k.layout = "stream";
  k.quiet = true;
  const TokenizeStats st = tokenize_files(k);

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

  const double ours = json_bytes / 1e6 / st.seconds;
  std::printf("bench data: %.1f MB of C4 JSON (%lld documents, %lld tokens)\n", json_bytes / 1e6, (long long)st.documents,
              (long long)st.tokens);
  std::printf("  multinorm data tokenize: %.2f s, %.1f MB/s of JSON input\n", st.seconds, ours);
  if (rc == 0)
    std::printf("  spm_encode (Debian CLI), same text: %.2f s, %.1f MB/s -> tokenize is %.2fx spm_encode\n", spm_s,
                json_bytes / 1e6 / spm_s, spm_s / st.seconds);
  else
    std::printf("  spm_encode: not available (apt-get install sentencepiece)\n");
  std::printf("  loader: %.0f tokens/s (16 x 256 micro-batches, shuffled, prefetch) = %.0fx a %.0f tokens/s trainer\n",
              tokens / loader_s, tokens / loader_s / o.train_tokens_per_s, o.train_tokens_per_s);
}

}  // namespace multinorm
