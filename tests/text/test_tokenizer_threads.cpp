// One loaded tokenizer shared by several threads (its word cache and regexes are shared) gives each
// thread the ids a lone thread gets.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "hybridflow/text/tokenizer.h"
#include "support/testdata_dir.h"
#include "tokenizer_corpus.h"

namespace hybridflow::text {
namespace {

TEST(TokenizerThreads, SharedTokenizerEncodesTheSameInEveryThread) {
  const std::string path = testing::tokenizer_data_dir() + "/qwen3/tokenizer.json";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "not found: " << path << " (looked in " << testing::tokenizer_data_searched() << ")";
  const std::vector<std::string> corpus = testing::tokenizer_corpus();
  std::vector<std::vector<int32_t>> expected;
  {
    const Tokenizer fresh = Tokenizer::from_file(path);
    for (const std::string& s : corpus) expected.push_back(fresh.encode(s));
  }
  const Tokenizer shared = Tokenizer::from_file(path);  // its cache starts empty: threads fill it together
  constexpr int kThreads = 4;
  std::vector<int> mismatches(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 3; ++round)
        for (size_t i = 0; i < corpus.size(); ++i) {
          const size_t k = (i * (t + 1) + round) % corpus.size();  // a different order per thread
          if (shared.encode(corpus[k]) != expected[k]) ++mismatches[static_cast<size_t>(t)];
        }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(mismatches[static_cast<size_t>(t)], 0) << "thread " << t;
}

}  // namespace
}  // namespace hybridflow::text
