// The data pipeline: C4 json.gz -> shards (round trip, truncation, EOS, padding, bad input),
// the shard format's checks, and the loader (determinism, rank slices, resume, validation budget).
#include <gtest/gtest.h>
#include <sys/time.h>
#include <unistd.h>
#include <zlib.h>

#include <fstream>
#include <random>
#include <set>

#include "multinorm/c4_reader.h"
#include "multinorm/data_tools.h"
#include "multinorm/error.h"
#include "multinorm/loader.h"
#include "multinorm/shard.h"
#include "multinorm/tokenizer.h"
#include "test_util.h"

using namespace multinorm;
using multinorm::testing::TempDir;
using multinorm::testing::expect_error;

namespace {

void write_gz(const std::string& path, const std::string& content) {
  gzFile f = gzopen(path.c_str(), "wb");
  gzwrite(f, content.data(), static_cast<unsigned>(content.size()));
  gzclose(f);
}

// Generated English-like text (not third-party text): sentences over a small word list.
std::string make_text(std::mt19937& gen, int sentences) {
  static const char* words[] = {"the", "model", "learns", "a", "gradient", "of", "every", "layer", "and", "rows",
                                "columns", "normalise", "quickly", "data", "shard", "token", "small", "large"};
  std::string t;
  for (int s = 0; s < sentences; ++s) {
    const int n = 4 + static_cast<int>(gen() % 8);
    for (int w = 0; w < n; ++w) t += std::string(w ? " " : "") + words[gen() % 18];
    t += s % 3 == 2 ? ".\n" : ". ";
  }
  return t;
}

std::string c4_line(const std::string& text, int i) {
  return json{{"text", text}, {"timestamp", "2019-04-25T12:57:54Z"}, {"url", "test:" + std::to_string(i)}}.dump() + "\n";
}

// One tokenizer for the suite, trained on generated text.
struct Fixture {
  TempDir dir;
  std::string tokenizer;
  std::vector<std::string> texts;
  Fixture() {
    std::mt19937 gen(1);
    std::string all;
    for (int i = 0; i < 300; ++i) {
      texts.push_back(make_text(gen, 2 + static_cast<int>(gen() % 40)));
      all += c4_line(texts.back(), i);
    }
    write_gz(dir.path() + "/c4-train.00000-of-00001.json.gz", all);
    TrainTokenizerOptions o;
    o.inputs = dir.path() + "/c4-train.00000-of-00001.json.gz";
    o.out_prefix = dir.path() + "/tok";
    o.vocab_size = 300;
    train_tokenizer(o);
    tokenizer = o.out_prefix + ".model";
  }
};

Fixture& fixture() {
  static Fixture f;
  return f;
}

// Quiet tokenize options with the suite's tokenizer.
TokenizeOptions tokenize_options(const std::string& inputs, const std::string& out_dir) {
  TokenizeOptions o;
  o.inputs = inputs;
  o.tokenizer = fixture().tokenizer;
  o.out_dir = out_dir;
  o.quiet = true;
  return o;
}

// Shards written directly with synthetic ids: row r of shard s starts with a unique id.
std::string file_bytes(const std::string& path) {
  std::ifstream i(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(i), {});
}

// Recomputes a version 2 header's checksum after a test edited a field on purpose.
void reseal_header(std::string& b) {
  const uint32_t crc = static_cast<uint32_t>(::crc32(0L, reinterpret_cast<const Bytef*>(b.data()), 124));
  std::memcpy(&b[124], &crc, 4);
}

std::vector<std::string> synthetic_shards(const TempDir& dir, int shards, int rows, ShardLayout layout, int seq_len) {
  std::vector<std::string> paths;
  std::mt19937 gen(3);
  for (int s = 0; s < shards; ++s) {
    const std::string p = dir.path() + "/s" + std::to_string(s) + ".tok";
    ShardWriter w(p, 5000, 1, -1, layout, static_cast<uint32_t>(seq_len));
    for (int r = 0; r < rows; ++r) {
      std::vector<int32_t> ids = {2 + s * rows + r};
      const int len = 3 + static_cast<int>(gen() % (2 * seq_len));
      for (int t = 1; t < len; ++t) ids.push_back(static_cast<int32_t>(gen() % 5000));
      ids.push_back(1);
      w.add_document(ids);
    }
    w.finish();
    paths.push_back(p);
  }
  return paths;
}

}  // namespace

TEST(Tokenize, RowsRoundTripWithTruncationEosAndCounts) {
  Fixture& f = fixture();
  TempDir out;
  TokenizeOptions o = tokenize_options(f.dir.path() + "/c4-train.*.json.gz", out.path());
  o.seq_len = 32;
  const TokenizeStats st = tokenize_files(o);
  EXPECT_EQ(st.documents, 300);
  EXPECT_GT(st.truncated, 10);
  const Tokenizer tok(f.tokenizer);
  const Shard shard(out.path() + "/c4-train.00000-of-00001.tok");
  ASSERT_EQ(shard.header().num_docs, 300u);
  EXPECT_EQ(shard.header().eos_id, tok.eos_id());
  EXPECT_EQ(shard.header().token_bytes, 2u);
  for (int d = 0; d < 300; ++d) {
    std::vector<int32_t> expect = tok.encode(f.texts[d]);
    expect.push_back(tok.eos_id());
    if (expect.size() > 32) {  // truncated to seq_len, EOS kept as the last token
      expect.resize(32);
      expect.back() = tok.eos_id();
    }
    ASSERT_EQ(shard.row_length(d), expect.size()) << d;
    for (size_t t = 0; t < expect.size(); ++t) ASSERT_EQ(static_cast<int32_t>(shard.token(shard.row_start(d) + t)), expect[t]);
  }
  // Resumable: a second run skips the complete shard and leaves it as it was.
  const TokenizeStats again = tokenize_files(o);
  EXPECT_EQ(again.skipped_files, 1);
  EXPECT_EQ(again.files, 0);
}

// A shard made from another seq_len, layout, tokenizer or input is never reused silently: refused
// naming the difference, or rebuilt with --overwrite.
TEST(Tokenize, StaleShardsAreRefusedOrRebuilt) {
  Fixture& f = fixture();
  TempDir in, out;
  const std::string input = in.path() + "/c4-train.00000-of-00001.json.gz";
  std::string lines;
  for (int i = 0; i < 20; ++i) lines += c4_line(f.texts[i], i);
  write_gz(input, lines);
  TokenizeOptions o = tokenize_options(input, out.path());
  o.seq_len = 32;
  tokenize_files(o);
  const std::string shard = out.path() + "/c4-train.00000-of-00001.tok";
  o.seq_len = 64;
  expect_error([&] { tokenize_files(o); }, {shard, "seq_len 32, asked 64", "--overwrite"});
  o.seq_len = 32;
  o.layout = "stream";
  expect_error([&] { tokenize_files(o); }, {shard, "layout rows, asked stream"});
  o.layout = "rows";
  write_gz(input, lines + c4_line(f.texts[20], 20));  // the input grew
  expect_error([&] { tokenize_files(o); }, {shard, "its input changed"});
  o.overwrite = true;
  const TokenizeStats rebuilt = tokenize_files(o);
  EXPECT_EQ(rebuilt.rebuilt_files, 1);
  EXPECT_EQ(Shard(shard).header().num_docs, 21u);
  o.overwrite = false;
  EXPECT_EQ(tokenize_files(o).skipped_files, 1);  // now current: skipped
  // A copy of the tokenizer is the same tokenizer; another model is not.
  const std::string copy = in.path() + "/copy.model";
  {
    std::ifstream src(f.tokenizer, std::ios::binary);
    std::ofstream dst(copy, std::ios::binary);
    dst << src.rdbuf();
  }
  o.tokenizer = copy;
  EXPECT_EQ(tokenize_files(o).skipped_files, 1);
  TrainTokenizerOptions t;
  t.inputs = f.dir.path() + "/c4-train.00000-of-00001.json.gz";
  t.out_prefix = in.path() + "/other";
  t.vocab_size = 320;
  train_tokenizer(t);
  o.tokenizer = t.out_prefix + ".model";
  expect_error([&] { tokenize_files(o); }, {shard, "another tokenizer"});
}

TEST(Tokenize, StreamLayoutConcatenatesWithEos) {
  Fixture& f = fixture();
  TempDir out;
  TokenizeOptions o = tokenize_options(f.dir.path() + "/c4-train.00000-of-00001.json.gz", out.path());
  o.layout = "stream";
  tokenize_files(o);
  const Tokenizer tok(f.tokenizer);
  const Shard shard(out.path() + "/c4-train.00000-of-00001.tok");
  std::vector<int32_t> expect;
  for (const auto& t : f.texts) {
    const auto ids = tok.encode(t);
    expect.insert(expect.end(), ids.begin(), ids.end());
    expect.push_back(tok.eos_id());
  }
  ASSERT_EQ(shard.header().num_tokens, expect.size());
  for (size_t i = 0; i < expect.size(); ++i) ASSERT_EQ(static_cast<int32_t>(shard.token(i)), expect[i]);
}

TEST(Tokenize, BadInputIsReportedWithFileAndLine) {
  Fixture& f = fixture();
  TempDir in, out;
  std::mt19937 gen(2);
  const std::string good = c4_line(make_text(gen, 5), 0);
  write_gz(in.path() + "/bad.json.gz", good + "{not json\n" + R"({"url": "x"})" + "\n" + R"({"text": ""})" + "\n" + good);
  TokenizeOptions o = tokenize_options(in.path() + "/bad.json.gz", out.path());
  o.max_bad_lines = 1;  // two malformed records: over the limit
  expect_error([&] { tokenize_files(o); }, {"bad.json.gz:3", "more than 1 malformed"});
  o.max_bad_lines = 5;
  const TokenizeStats st = tokenize_files(o);
  EXPECT_EQ(st.malformed, 2);
  EXPECT_EQ(st.empty, 1);
  EXPECT_EQ(st.documents, 2);
  // A truncated gzip stream names the file.
  std::string gz = file_bytes(f.dir.path() + "/c4-train.00000-of-00001.json.gz");
  std::ofstream(in.path() + "/cut.json.gz", std::ios::binary) << gz.substr(0, gz.size() / 2);
  o.inputs = in.path() + "/cut.json.gz";
  expect_error([&] { tokenize_files(o); }, {"cut.json.gz", "truncated or corrupt"});
  o.inputs = in.path() + "/absent-*.json.gz";
  expect_error([&] { tokenize_files(o); }, {"absent-*.json.gz: no file matches"});
}

TEST(Tokenize, FileWorkersWriteTheSameShardsAndStopOnABadFile) {
  TempDir in;
  std::mt19937 gen(4);
  for (int file = 0; file < 4; ++file) {
    std::string all;
    for (int d = 0; d < 60; ++d) all += c4_line(make_text(gen, 1 + static_cast<int>(gen() % 30)), d);
    write_gz(in.path() + "/c4-train.0000" + std::to_string(file) + "-of-00004.json.gz", all);
  }
  auto run = [&](int workers, int threads, const std::string& out) {
    TokenizeOptions o = tokenize_options(in.path() + "/c4-train.*.json.gz", out);
    o.seq_len = 64;
    o.threads = threads;
    o.file_workers = workers;
    return tokenize_files(o);
  };
  TempDir one, four;
  const TokenizeStats a = run(1, 1, one.path()), b = run(4, 4, four.path());
  EXPECT_EQ(a.files, 4);
  EXPECT_EQ(b.files, 4);
  EXPECT_EQ(a.documents, b.documents);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.truncated, b.truncated);
  EXPECT_EQ(a.json_bytes, b.json_bytes);
  ASSERT_EQ(a.outputs.size(), 4u);
  ASSERT_EQ(b.outputs.size(), 4u);
  for (size_t i = 0; i < a.outputs.size(); ++i) {
    std::ifstream x(a.outputs[i], std::ios::binary), y(b.outputs[i], std::ios::binary);
    const std::string bx((std::istreambuf_iterator<char>(x)), {}), by((std::istreambuf_iterator<char>(y)), {});
    EXPECT_FALSE(bx.empty());
    EXPECT_EQ(bx, by) << a.outputs[i];
  }
  // A corrupt file among them fails the run naming it; the good shards stay valid, the bad one is absent.
  const std::string victim = in.path() + "/c4-train.00002-of-00004.json.gz";
  std::string gz = file_bytes(victim);
  std::ofstream(victim, std::ios::binary | std::ios::trunc) << gz.substr(0, gz.size() / 2);
  TempDir bad;
  expect_error([&] { run(4, 4, bad.path()); }, {"c4-train.00002-of-00004.json.gz", "truncated or corrupt"});
  std::ifstream absent(bad.path() + "/c4-train.00002-of-00004.tok");
  EXPECT_FALSE(absent.good());
}

// Every corrupted copy of a valid shard is refused with an error naming the file: random byte flips
// (header or data), truncations and appended bytes. Never a crash or a pass; opening without data
// verification and reading every row never touches memory outside the file (run under ASan:
// scripts/sanitize.sh).
TEST(ShardFormat, FuzzedShardsAreAlwaysRefusedNeverCrash) {
  TempDir dir;
  for (ShardLayout layout : {ShardLayout::Rows, ShardLayout::Stream}) {
    const auto paths = synthetic_shards(dir, 1, 12, layout, 16);
    const std::string bytes = file_bytes(paths[0]);
    std::mt19937 gen(layout == ShardLayout::Rows ? 11 : 12);
    const std::string path = dir.path() + "/fuzz.tok";
    for (int trial = 0; trial < 200; ++trial) {
      std::string b = bytes;
      const int kind = trial % 4;
      if (kind == 0) b.resize(gen() % b.size());                            // truncated
      else if (kind == 1) b += std::string(1 + gen() % 9, char(gen()));   // appended
      else {                                                               // 1 to 3 bytes changed
        const int flips = 1 + static_cast<int>(gen() % 3);
        for (int f = 0; f < flips; ++f) {
          // Half of the flips land in the 128-byte header, where a trusted field would do harm.
          const size_t at = gen() % 2 ? gen() % kShardHeaderBytes : gen() % b.size();
          b[at] = static_cast<char>(b[at] ^ (1 + gen() % 255));
        }
      }
      if (b == bytes) continue;
      std::ofstream(path, std::ios::binary | std::ios::trunc) << b;
      ::unlink((path + ".verified").c_str());
      expect_error([&] { Shard s(path, true); }, {"fuzz.tok"});
      try {  // header-only open: either refused, or every row is readable inside the mapping
        const Shard s(path, false);
        uint64_t sum = 0;
        if (s.header().layout == ShardLayout::Rows)
          for (uint64_t r = 0; r < s.header().num_docs; ++r)
            for (uint32_t t = 0; t < s.row_length(r); ++t) sum += s.token(s.row_start(r) + t);
        else
          for (uint64_t t = 0; t < s.header().num_tokens; ++t) sum += s.token(t);
        EXPECT_GE(sum, 0u);
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("fuzz.tok"), std::string::npos) << e.what();
      }
    }
  }
}

// Version 1 shards (no provenance, no header checksum) are still read.
TEST(ShardFormat, Version1ShardsAreStillRead) {
  TempDir dir;
  const auto paths = synthetic_shards(dir, 1, 5, ShardLayout::Rows, 16);
  std::string b = file_bytes(paths[0]);
  b[8] = 1;
  std::memset(&b[76], 0, kShardHeaderBytes - 76);
  const std::string v1 = dir.path() + "/v1.tok";
  std::ofstream(v1, std::ios::binary) << b;
  const Shard s(v1, true);
  EXPECT_EQ(s.header().version, 1u);
  EXPECT_EQ(s.header().num_docs, 5u);
}

// A start reads headers only; each shard's data is verified the first time the loader touches it,
// unless a .verified record (written by the tokenizer and `data verify`) shows it unchanged.
TEST(ShardFormat, DataIsVerifiedLazilyAndOnce) {
  TempDir dir;
  const auto paths = synthetic_shards(dir, 2, 10, ShardLayout::Rows, 16);
  EXPECT_TRUE(Shard(paths[0], false).verification_recorded());  // the writer recorded it
  // Corrupt shard 1's data (same size), then touch its mtime: the record no longer matches.
  {
    std::fstream f(paths[1], std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(200);
    f.put('\x7f');
  }
  ::utimes(paths[1].c_str(), nullptr);
  EXPECT_FALSE(Shard(paths[1], false).verification_recorded());
  const auto set = std::make_shared<const ShardSet>(paths, 16, 5000);  // opening does not read the data
  set->ensure_verified(0);
  expect_error([&] { set->ensure_verified(1); }, {"s1.tok", "checksum mismatch"});
  // The loader verifies before it reads: the corrupt shard stops the run, naming it.
  LoaderOptions o;
  o.micro_batch = 4;
  o.shuffle_window = 1;
  o.shuffle = false;
  TrainLoader loader(set, o);
  expect_error([&] { for (int i = 0; i < 10; ++i) loader.next(); }, {"s1.tok", "checksum mismatch"});
}

TEST(ShardFormat, CorruptShardsAreRefused) {
  TempDir dir;
  const auto paths = synthetic_shards(dir, 1, 20, ShardLayout::Rows, 16);
  std::string bytes = file_bytes(paths[0]);
  auto variant = [&](const std::string& name, std::string b) {
    std::ofstream(dir.path() + "/" + name, std::ios::binary) << b;
    return dir.path() + "/" + name;
  };
  EXPECT_NO_THROW(Shard ok(paths[0]));
  std::string b = bytes;
  b[0] = 'X';
  expect_error([&] { Shard(variant("magic.tok", b)); }, {"magic.tok", "wrong magic"});
  b = bytes;
  b[8] = 3;
  expect_error([&] { Shard(variant("version.tok", b)); }, {"version.tok", "format version 3"});
  b = bytes;
  b[100] ^= 1;  // a reserved byte: only the header checksum sees it
  expect_error([&] { Shard(variant("header.tok", b)); }, {"header.tok", "header checksum mismatch"});
  expect_error([&] { Shard(variant("cut.tok", bytes.substr(0, bytes.size() - 7))); }, {"cut.tok", "truncated"});
  expect_error([&] { Shard(variant("short.tok", bytes.substr(0, 50))); }, {"short.tok", "truncated"});
  b = bytes;
  b[200] ^= 0x40;
  expect_error([&] { Shard(variant("flip.tok", b)); }, {"flip.tok", "checksum mismatch"});
  b = bytes;
  const uint32_t small_vocab = 100;  // the header's vocabulary, below the stored ids
  std::memcpy(&b[16], &small_vocab, 4);
  reseal_header(b);
  expect_error([&] { Shard(variant("vocab.tok", b)); }, {"vocab.tok", ">= vocab_size 100"});
  b = bytes;
  const uint64_t huge = uint64_t{1} << 62;  // a count whose byte size overflows 64 bits
  std::memcpy(&b[48], &huge, 8);
  reseal_header(b);
  expect_error([&] { Shard(variant("count.tok", b)); }, {"count.tok", "token count", "does not fit"});
  expect_error([&] { ShardWriter w(dir.path() + "/w.tok", 10, 1, -1, ShardLayout::Rows, 8); w.add_document({3, 12}); },
               {"w.tok", "token id 12 outside the vocabulary of 10"});
}

TEST(Loader, RowsBatchesMaskPaddingAndCountTargets) {
  TempDir dir;
  const auto paths = synthetic_shards(dir, 1, 10, ShardLayout::Rows, 16);
  const ShardSet set(paths, 16, 5000);
  const Shard shard(paths[0]);
  LoaderOptions o;
  o.micro_batch = 10;
  o.shuffle = false;
  LoaderCursor c;
  WindowOrder w;
  const Batch b = TrainLoader::make_batch(set, o, c, w);
  int64_t expect_count = 0;
  for (int r = 0; r < 10; ++r) {
    const int64_t len = shard.row_length(r);
    expect_count += len - 1;
    for (int64_t t = 0; t < 16; ++t) {
      EXPECT_EQ(b.mask[r * 16 + t], t + 1 < len ? 1 : 0);
      if (t < len) {
        EXPECT_EQ(b.tokens[r * 16 + t], static_cast<int32_t>(shard.token(shard.row_start(r) + t)));
      }
      if (t + 1 < len) {
        EXPECT_EQ(b.targets[r * 16 + t], static_cast<int32_t>(shard.token(shard.row_start(r) + t + 1)));
      }
    }
  }
  EXPECT_EQ(b.count, expect_count);
  EXPECT_EQ(b.global_count, expect_count);
}

TEST(Loader, ShuffleIsDeterministicPerSeedAndRanksAreDisjointAndCovering) {
  TempDir dir;
  const auto paths = synthetic_shards(dir, 5, 24, ShardLayout::Rows, 8);
  const ShardSet set(paths, 8, 5000);
  auto epoch_ids = [&](uint64_t seed, int rank, int world) {
    LoaderOptions o;
    o.micro_batch = 4;
    o.rank = rank;
    o.world = world;
    o.seed = seed;
    o.shuffle_window = 2;
    LoaderCursor c;
    WindowOrder w;
    std::vector<int32_t> ids;
    for (int step = 0; step < 120 / (4 * world); ++step) {  // one epoch of 120 sequences
      const Batch b = TrainLoader::make_batch(set, o, c, w);
      for (int r = 0; r < 4; ++r) ids.push_back(b.tokens[r * 8]);  // each row's first token is its id
    }
    return ids;
  };
  EXPECT_EQ(epoch_ids(7, 0, 1), epoch_ids(7, 0, 1));
  EXPECT_NE(epoch_ids(7, 0, 1), epoch_ids(8, 0, 1));
  // 120 sequences, 3 ranks x 4 per step: 10 steps an epoch, each rank a disjoint third.
  std::set<int32_t> all;
  size_t total = 0;
  for (int r = 0; r < 3; ++r) {
    const auto ids = epoch_ids(7, r, 3);
    total += ids.size();
    all.insert(ids.begin(), ids.end());
  }
  EXPECT_EQ(total, 120u);
  EXPECT_EQ(all.size(), 120u);
  // Without shuffling, the order is the shards' own.
  LoaderOptions plain;
  plain.micro_batch = 4;
  plain.shuffle = false;
  LoaderCursor c;
  WindowOrder w;
  const Batch b = TrainLoader::make_batch(set, plain, c, w);
  EXPECT_EQ(b.tokens[0], 2);
  EXPECT_EQ(b.tokens[8], 3);
}

TEST(Loader, ResumeFromACursorContinuesExactly) {
  TempDir dir;
  const auto paths = synthetic_shards(dir, 3, 16, ShardLayout::Stream, 8);
  auto set = std::make_shared<const ShardSet>(paths, 8, 5000);
  LoaderOptions o;
  o.micro_batch = 5;
  o.seed = 11;
  o.shuffle_window = 2;
  o.prefetch = 3;
  std::vector<Batch> straight;
  {
    TrainLoader l(set, o);
    for (int i = 0; i < 40; ++i) straight.push_back(l.next());  // several epochs
  }
  EXPECT_GT(straight.back().after.epoch, 0);
  TrainLoader resumed(set, o, straight[16].after);
  for (int i = 17; i < 40; ++i) {
    const Batch b = resumed.next();
    ASSERT_EQ(b.tokens, straight[i].tokens) << i;
    ASSERT_EQ(b.targets, straight[i].targets);
    ASSERT_TRUE(b.after == straight[i].after);
  }
}

TEST(Loader, ValidationIteratorStopsAtTheTokenBudget) {
  TempDir dir;
  const auto paths = synthetic_shards(dir, 2, 30, ShardLayout::Rows, 16);
  auto set = std::make_shared<const ShardSet>(paths, 16, 5000);
  int64_t all = 0;
  for (int s = 0; s < 2; ++s)
    for (int i = 0; i < 30; ++i) all += set->targets(s, i);
  EvalLoader whole(set, 4, 1 << 30);
  Batch b;
  int64_t sum = 0, batches = 0;
  std::vector<int64_t> per_batch;
  while (whole.next(b)) sum += b.count, ++batches, per_batch.push_back(b.count);
  EXPECT_EQ(sum, all);                 // the whole set when the budget exceeds it
  EXPECT_EQ(batches, 15);              // 60 sequences / 4
  EXPECT_EQ(whole.tokens_seen(), all);
  // A budget stops after the batch that reaches it, and the same batches every time.
  const int64_t budget = per_batch[0] + per_batch[1] + 1;
  EvalLoader part(set, 4, budget);
  int64_t n = 0, seen = 0;
  while (part.next(b)) ++n, seen += b.count;
  EXPECT_EQ(n, 3);
  EXPECT_EQ(seen, per_batch[0] + per_batch[1] + per_batch[2]);
  EXPECT_GE(part.tokens_seen(), budget);
}

TEST(Loader, VocabularyLargerThanTheModelIsRefused) {
  TempDir dir;
  const auto paths = synthetic_shards(dir, 1, 4, ShardLayout::Rows, 8);
  expect_error([&] { ShardSet set(paths, 8, 1000); }, {"s0.tok", "vocabulary of 5000", "1000 embeddings"});
}
