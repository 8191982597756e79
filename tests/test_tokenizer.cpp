// The tokenizer's word cache: segment-wise encoding must give exactly SentencePiece's whole-text ids,
// for every normalisation it accepts, on random text built to hit the edge cases (space runs, leading
// and trailing spaces, tabs, newlines, non-ASCII spaces, combining marks, a raw U+2581, digits); and the
// models where it would not be exact must be recognised and encoded whole.
#include <gtest/gtest.h>
#include <sentencepiece_trainer.h>

#include <fstream>
#include <random>

#include "multinorm/tokenizer.h"
#include "test_util.h"

using namespace multinorm;
using multinorm::testing::TempDir;

namespace {

const std::vector<std::string>& pieces_of_text() {
  static const std::vector<std::string> p = {
      "the", "model", "learns", "gradient", "of", "rows", "and", "columns", "normalise", "café", "naïve", "über",
      "日本語", "テキスト", "🙂", "2024", "3.14", "e.g.", "(see", "below)", "x=y+1;", "don't", "\"quoted\"", "—",
      "e\xCC\x81",      // e + combining acute (NFKC composes it)
      "\xEF\xAC\x81",   // U+FB01 "fi" ligature (NFKC expands it)
      "\xE2\x96\x81",   // a raw U+2581 in the input
      "A", "Z", "ｆｕｌｌ",  // full-width letters (NFKC folds them)
  };
  return p;
}

const std::vector<std::string>& gaps() {
  static const std::vector<std::string> g = {" ", " ", " ", " ", "  ", "   ", "\n", " \n ", "\t", " \t",
                                             "\xC2\xA0",       // no-break space
                                             "\xE3\x80\x80",   // ideographic space
                                             "", ", ", ". "};
  return g;
}

std::string random_text(std::mt19937& gen, int words) {
  const auto& p = pieces_of_text();
  const auto& g = gaps();
  std::string t;
  if (gen() % 4 == 0) t += std::string(1 + gen() % 3, ' ');  // leading spaces
  for (int w = 0; w < words; ++w) t += p[gen() % p.size()] + (w + 1 < words ? g[gen() % g.size()] : "");
  if (gen() % 4 == 0) t += std::string(1 + gen() % 3, ' ');  // trailing spaces
  return t;
}

// Trains a small SentencePiece model on generated text with the given extra flags.
std::string train(const TempDir& dir, const std::string& name, const std::string& flags) {
  const std::string corpus = dir.path() + "/" + name + ".txt";
  {
    std::mt19937 gen(7);
    std::ofstream out(corpus);
    for (int i = 0; i < 3000; ++i) out << random_text(gen, 3 + static_cast<int>(gen() % 12)) << "\n";
  }
  const auto status = sentencepiece::SentencePieceTrainer::Train(
      "--input=" + corpus + " --model_prefix=" + dir.path() + "/" + name +
      " --vocab_size=800 --hard_vocab_limit=false --character_coverage=1.0 --byte_fallback=true --minloglevel=2 --num_threads=2 " + flags);
  EXPECT_TRUE(status.ok()) << status.ToString();
  return dir.path() + "/" + name + ".model";
}

// Encodes many random texts with and without a cache; every result must match exactly.
void expect_cache_exact(const Tokenizer& tok) {
  std::mt19937 gen(11);
  WordCache cache;
  std::vector<std::string> texts = {"", " ", "   ", "a", " a", "a ", "a  ", "  a  b  ", "a\n b", "x \xE2\x96\x81 y"};
  for (int i = 0; i < 3000; ++i) texts.push_back(random_text(gen, 1 + static_cast<int>(gen() % 30)));
  for (const auto& t : texts) ASSERT_EQ(tok.encode(t, &cache), tok.encode(t)) << "text: [" << t << "]";
  EXPECT_GT(cache.hits(), cache.misses());  // the texts repeat their words: the cache is used
}

}  // namespace

TEST(Tokenizer, WordCacheIsExactForBpeWithIdentityNormalisation) {
  TempDir dir;  // LLaMA-like: identity, whitespace kept, digits split
  const Tokenizer tok(train(dir, "bpe_identity", "--model_type=bpe --normalization_rule_name=identity "
                                                 "--remove_extra_whitespaces=false --split_digits=true"));
  ASSERT_TRUE(tok.word_cache_exact()) << tok.word_cache_why_not();
  expect_cache_exact(tok);
}

TEST(Tokenizer, WordCacheIsExactForBpeWithNfkcAndWhitespaceRemoval) {
  TempDir dir;  // SentencePiece's defaults: nmt_nfkc, extra whitespace removed
  const Tokenizer tok(train(dir, "bpe_nfkc", "--model_type=bpe"));
  ASSERT_TRUE(tok.word_cache_exact()) << tok.word_cache_why_not();
  expect_cache_exact(tok);
}

TEST(Tokenizer, WordCacheIsExactForBpeWithNfkcKeepingWhitespace) {
  TempDir dir;  // NFKC maps no-break and ideographic spaces to spaces, which are then kept
  const Tokenizer tok(train(dir, "bpe_nfkc_ws", "--model_type=bpe --remove_extra_whitespaces=false "
                                                "--allow_whitespace_only_pieces=true"));
  ASSERT_TRUE(tok.word_cache_exact()) << tok.word_cache_why_not();
  expect_cache_exact(tok);
}

TEST(Tokenizer, ModelsWhereTheCacheWouldNotBeExactAreEncodedWhole) {
  TempDir dir;
  const Tokenizer unigram(train(dir, "unigram", "--model_type=unigram"));
  EXPECT_FALSE(unigram.word_cache_exact());
  EXPECT_EQ(unigram.word_cache_why_not(), "not a BPE model");
  // Pieces may cross spaces when trained without splitting at whitespace: the check must find one.
  const Tokenizer spanning(train(dir, "spanning", "--model_type=bpe --split_by_whitespace=false"));
  EXPECT_FALSE(spanning.word_cache_exact());
  EXPECT_NE(spanning.word_cache_why_not().find("spans a word boundary"), std::string::npos)
      << spanning.word_cache_why_not();
  const Tokenizer no_prefix(train(dir, "no_prefix", "--model_type=bpe --add_dummy_prefix=false"));
  EXPECT_FALSE(no_prefix.word_cache_exact());
  for (const Tokenizer* tok : {&unigram, &spanning, &no_prefix}) {
    WordCache cache;
    std::mt19937 gen(5);
    for (int i = 0; i < 200; ++i) {
      const std::string t = random_text(gen, 1 + static_cast<int>(gen() % 20));
      ASSERT_EQ(tok->encode(t, &cache), tok->encode(t)) << t;
    }
    EXPECT_EQ(cache.hits() + cache.misses(), 0u);  // not used
  }
}

TEST(Tokenizer, BoundedCacheStaysExactWhenItIsEmptied) {
  TempDir dir;
  const Tokenizer tok(train(dir, "bpe", "--model_type=bpe --normalization_rule_name=identity "
                                        "--remove_extra_whitespaces=false"));
  ASSERT_TRUE(tok.word_cache_exact());
  WordCache tiny(8);  // emptied every 8 distinct segments
  std::mt19937 gen(3);
  for (int i = 0; i < 500; ++i) {
    const std::string t = random_text(gen, 1 + static_cast<int>(gen() % 30));
    ASSERT_EQ(tok.encode(t, &tiny), tok.encode(t)) << t;
  }
  EXPECT_GT(tiny.misses(), 500u);
}
