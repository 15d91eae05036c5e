// The fine-tuning loops' row order: every pass serves each row exactly once, batches cross pass
// boundaries without repeating a row early, and the order is a function of the seed alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "hybridflow/core/error.h"
#include "hybridflow/engine/shuffled_batches.h"
#include "support/error_of.h"

namespace hybridflow {
namespace {

std::vector<int64_t> first_rows(ShuffledBatches& batches, int count) {
  std::vector<int64_t> all;
  for (int i = 0; i < count; ++i) {
    const auto rows = batches.next();
    all.insert(all.end(), rows.begin(), rows.end());
  }
  return all;
}

TEST(ShuffledBatches, EachPassServesEveryRowOnceEvenAcrossBatchBoundaries) {
  // 7 rows in batches of 3: the third batch takes one row of the first pass and two of the second.
  ShuffledBatches batches(7, 3, 42);
  const auto rows = first_rows(batches, 7);  // 21 rows = exactly 3 passes
  ASSERT_EQ(rows.size(), 21u);
  std::vector<std::vector<int64_t>> passes;
  for (size_t p = 0; p < 3; ++p) {
    std::vector<int64_t> pass(rows.begin() + 7 * p, rows.begin() + 7 * (p + 1));
    std::sort(pass.begin(), pass.end());
    EXPECT_EQ(pass, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6})) << "pass " << p;
  }
  // Reshuffled between passes: three identical permutations of 7 rows would be a 1-in-5040^2 event.
  EXPECT_FALSE(std::equal(rows.begin(), rows.begin() + 7, rows.begin() + 7) &&
               std::equal(rows.begin() + 7, rows.begin() + 14, rows.begin() + 14));
}

TEST(ShuffledBatches, TheSeedAloneDeterminesTheOrder) {
  ShuffledBatches a(50, 8, 7), b(50, 8, 7), c(50, 8, 8);
  const auto rows_a = first_rows(a, 20);
  EXPECT_EQ(rows_a, first_rows(b, 20));
  EXPECT_NE(rows_a, first_rows(c, 20));
}

TEST(ShuffledBatches, ABatchLargerThanTheDataHoldsEachRowOnce) {
  ShuffledBatches batches(4, 10, 1);
  auto rows = batches.next();
  std::sort(rows.begin(), rows.end());
  EXPECT_EQ(rows, (std::vector<int64_t>{0, 1, 2, 3}));
}

TEST(ShuffledBatches, EmptyDataOrNonPositiveBatchSizeIsAnError) {
  EXPECT_NE(testing::error_of([] { ShuffledBatches(0, 4, 1); }).find("no rows"), std::string::npos);
  EXPECT_NE(testing::error_of([] { ShuffledBatches(4, 0, 1); }).find("batch_size is 0"), std::string::npos);
}

}  // namespace
}  // namespace hybridflow
