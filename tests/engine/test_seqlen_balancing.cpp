// trainer.balance_batch's partition: equal row counts per data-parallel rank with like token counts, the
// rows of each part in batch order, and a function of the lengths alone.
#include "hybridflow/engine/seqlen_balancing.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

#include "support/error_of.h"

namespace hybridflow {
namespace {

TEST(SeqlenBalancing, ClusteredLongRowsAreSpreadOverTheParts) {
  // Two prompts' samples in order: the first prompt's answers are long, the second's short.
  const std::vector<int64_t> lengths = {90, 80, 70, 60, 10, 12, 14, 16};
  EXPECT_EQ(chunk_token_sums(lengths, 2), (std::vector<int64_t>{300, 52}));
  const auto order = balanced_row_order(lengths, 2);
  ASSERT_EQ(order.size(), lengths.size());
  EXPECT_EQ(std::set<int64_t>(order.begin(), order.end()).size(), lengths.size()) << "a permutation";
  const auto sums = chunk_token_sums(lengths, 2, order);
  EXPECT_EQ(sums[0] + sums[1], 352);
  EXPECT_LE(std::abs(sums[0] - sums[1]), 10) << sums[0] << " / " << sums[1];
  for (size_t p = 0; p < 2; ++p) EXPECT_TRUE(std::is_sorted(order.begin() + 4 * p, order.begin() + 4 * (p + 1)));
  EXPECT_EQ(balanced_row_order(lengths, 1), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}));
}

TEST(SeqlenBalancing, RandomBatchesComeOutFlatterThanInOrder) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 50; ++trial) {
    const int64_t parts = 2 + trial % 7;
    std::vector<int64_t> lengths;
    // GRPO-like: groups of 8 samples whose lengths follow their prompt's difficulty.
    for (int64_t g = 0; g < parts * 2; ++g) {
      const int64_t scale = 20 + static_cast<int64_t>(rng() % 500);
      for (int s = 0; s < 8; ++s) lengths.push_back(16 + scale / 2 + static_cast<int64_t>(rng() % static_cast<uint64_t>(scale)));
    }
    const auto before = chunk_token_sums(lengths, parts);
    const auto after = chunk_token_sums(lengths, parts, balanced_row_order(lengths, parts));
    const int64_t longest = *std::max_element(lengths.begin(), lengths.end());
    EXPECT_LE(*std::max_element(after.begin(), after.end()), *std::max_element(before.begin(), before.end()));
    EXPECT_LE(*std::max_element(after.begin(), after.end()) - *std::min_element(after.begin(), after.end()), longest)
        << "trial " << trial;
  }
}

TEST(SeqlenBalancing, UnevenSplitsAreRefused) {
  EXPECT_NE(testing::error_of([] { balanced_row_order({1, 2, 3}, 2); }).find("3 rows do not split into 2"),
            std::string::npos);
}

}  // namespace
}  // namespace hybridflow
