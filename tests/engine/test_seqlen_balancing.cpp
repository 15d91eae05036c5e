// trainer.balance_batch's partition: equal row counts per data-parallel rank with like work, the rows of each
// part in batch order, and a function of the costs alone; Karmarkar-Karp's differencing against the greedy
// it replaced.
#include "hybridflow/engine/seqlen_balancing.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
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
  EXPECT_EQ(sums[0], sums[1]) << "{90, 60, 12, 14} against {80, 70, 10, 16}";
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

// The greedy balance_batch used before: longest rows first, each to the lightest part with room.
std::vector<int64_t> longest_first_greedy(const std::vector<int64_t>& lengths, int64_t parts) {
  std::vector<int64_t> by_length(lengths.size());
  std::iota(by_length.begin(), by_length.end(), 0);
  std::stable_sort(by_length.begin(), by_length.end(),
                   [&](int64_t a, int64_t b) { return lengths[static_cast<size_t>(a)] > lengths[static_cast<size_t>(b)]; });
  std::vector<std::vector<int64_t>> members(static_cast<size_t>(parts));
  std::vector<int64_t> sums(static_cast<size_t>(parts), 0);
  const size_t room = lengths.size() / static_cast<size_t>(parts);
  for (int64_t row : by_length) {
    size_t best = members.size();
    for (size_t p = 0; p < members.size(); ++p)
      if (members[p].size() < room && (best == members.size() || sums[p] < sums[best])) best = p;
    members[best].push_back(row);
    sums[best] += lengths[static_cast<size_t>(row)];
  }
  std::vector<int64_t> order;
  for (const auto& part : members) order.insert(order.end(), part.begin(), part.end());
  return order;
}

int64_t spread(const std::vector<int64_t>& sums) {
  return *std::max_element(sums.begin(), sums.end()) - *std::min_element(sums.begin(), sums.end());
}

TEST(SeqlenBalancing, DifferencingLeavesLessSpreadThanTheGreedy) {
  std::mt19937_64 rng(11);
  int64_t differencing_total = 0, greedy_total = 0, trials = 0, no_worse = 0;
  for (int64_t parts : {2, 4, 8}) {
    for (int trial = 0; trial < 100; ++trial, ++trials) {
      std::vector<int64_t> lengths;
      for (int64_t g = 0; g < 16; ++g) {  // 16 GRPO groups of 8 samples
        const int64_t scale = 20 + static_cast<int64_t>(rng() % 500);
        for (int s = 0; s < 8; ++s) lengths.push_back(16 + scale / 2 + static_cast<int64_t>(rng() % static_cast<uint64_t>(scale)));
      }
      const auto order = balanced_row_order(lengths, parts);
      EXPECT_EQ(std::set<int64_t>(order.begin(), order.end()).size(), lengths.size()) << "a permutation";
      const int64_t differencing = spread(chunk_token_sums(lengths, parts, order));
      const int64_t greedy = spread(chunk_token_sums(lengths, parts, longest_first_greedy(lengths, parts)));
      differencing_total += differencing;
      greedy_total += greedy;
      no_worse += differencing <= greedy;
    }
  }
  // Measured here: on average about an eighth of the greedy's spread, no worse in 99% of batches.
  EXPECT_LT(differencing_total * 3, greedy_total) << differencing_total << " against " << greedy_total;
  EXPECT_GE(no_worse * 100, trials * 95) << no_worse << " of " << trials;
}

TEST(SeqlenBalancing, RowsAreWeighedByTheirWorkNotJustTheirTokens) {
  // verl's estimate at h = 4096, and attention's square outweighing the projections at a small width.
  EXPECT_EQ(sequence_workload(1000, 4096), 24576 * 1000 + 1000 * 1000);
  EXPECT_EQ(sequence_workload(0, 64), 0);
  // At hidden size 8 a row's work is 48 L + L^2. Of these rows' splits into halves of 380 tokens (e.g. {200,
  // 100, 40, 40} and {150, 150, 60, 20}) none has less than 4,200 of work between its halves; the best split by
  // work, {150, 150, 60, 40} against {200, 100, 40, 20}, differs by 120 at 400 and 360 tokens (all 70 splits
  // tried by hand in Python).
  const std::vector<int64_t> lengths = {40, 150, 60, 20, 150, 100, 200, 40};
  std::vector<int64_t> work;
  for (int64_t n : lengths) work.push_back(sequence_workload(n, 8));
  const auto by_tokens = balanced_row_order(lengths, 2);
  const auto by_work = balanced_row_order(work, 2);
  EXPECT_EQ(spread(chunk_token_sums(lengths, 2, by_tokens)), 0);
  EXPECT_GE(spread(chunk_token_sums(work, 2, by_tokens)), 4200);
  EXPECT_EQ(spread(chunk_token_sums(work, 2, by_work)), 120);
  EXPECT_EQ(spread(chunk_token_sums(lengths, 2, by_work)), 40);
  EXPECT_NE(testing::error_of([] { sequence_workload(5, 0); }).find("hidden size 0"), std::string::npos);
}

TEST(SeqlenBalancing, UnevenSplitsAreRefused) {
  EXPECT_NE(testing::error_of([] { balanced_row_order({1, 2, 3}, 2); }).find("3 rows do not split into 2"),
            std::string::npos);
}

}  // namespace
}  // namespace hybridflow
