// The hand-written matchers of the GPT-2, Llama-3 and Qwen2 word patterns against Oniguruma itself
// on the same patterns: the same matches on the test corpus and on thousands of random texts.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "text/pre_tokenizers.h"
#include "text/regex.h"
#include "text/word_scanner.h"
#include "tokenizer_corpus.h"

namespace hybridflow::text {
namespace {

const char* const kPatterns[] = {
    kGpt2WordPattern,
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
};

TEST(WordScanner, KnowsExactlyThePatternsItImplements) {
  for (const char* p : kPatterns) EXPECT_NE(WordScanner::for_pattern(p), nullptr) << p;
  EXPECT_EQ(WordScanner::for_pattern(std::string(kPatterns[1]) + " "), nullptr);
  EXPECT_EQ(WordScanner::for_pattern(R"(\w+|[^\w\s]+)"), nullptr);
}

TEST(WordScanner, SameMatchesAsOniguruma) {
  std::vector<std::string> texts = testing::tokenizer_corpus();
  for (std::string& s : testing::random_tokenizer_texts(4000, 99)) texts.push_back(std::move(s));
  // Fragments that hit the one undecided case (a non-ASCII letter in a contraction) and its neighbours.
  for (const char* s : {"'\xc5\xbf", "x'\xc5\xbf", "'r\xc3\xa9", "'L\xc3\xa9", "'S'T'RE'vE'M'lL'D", "'\xc3\x89t\xc3\xa9"})
    texts.push_back(s);
  size_t undecided = 0;
  for (const char* pattern : kPatterns) {
    const Regex fast(pattern), engine(pattern, /*use_scanner=*/false);
    const auto scanner = WordScanner::for_pattern(pattern);
    for (const std::string& text : texts) {
      std::vector<std::pair<size_t, size_t>> a, b, direct;
      fast.find_all(text, a);
      engine.find_all(text, b);
      ASSERT_EQ(a, b) << "pattern " << pattern << "\ntext: " << text;
      if (!scanner->find_all(text, direct)) {
        ++undecided;
        EXPECT_TRUE(direct.empty());
      }
    }
  }
  EXPECT_GT(undecided, 0u);  // the fallback was exercised
}

}  // namespace
}  // namespace hybridflow::text
