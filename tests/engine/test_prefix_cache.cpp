// Prefix caching's record of which held blocks hold which ids: a chain of whole blocks from position 0,
// matched id for id, always leaving a context's last position to prefill, and forgotten when a block is
// freed or taken again.
#include "hybridflow/engine/prefix_cache.h"

#include <gtest/gtest.h>

#include "support/error_of.h"

namespace hybridflow {
namespace {

using testing::error_of;

TEST(PrefixCache, FindsTheLongestRunOfWholeBlocksAContextBeginsWith) {
  BlockManager bm(16, 4);
  PrefixCache cache(4);
  const std::vector<int64_t> a = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};  // 2 whole blocks and 3 ids
  EXPECT_TRUE(cache.find(a, bm).empty());
  const int64_t s = bm.admit(static_cast<int64_t>(a.size()), 1, 16).front();
  cache.record(a, bm.table(s), 2, bm);
  EXPECT_EQ(cache.find(a, bm), (std::vector<int64_t>{0, 1}));
  // Another context with the same first 8 ids; one with only the first 4; one that differs in the first block.
  EXPECT_EQ(cache.find({1, 2, 3, 4, 5, 6, 7, 8, 40}, bm), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(cache.find({1, 2, 3, 4, 5, 6, 7, 9, 40}, bm), (std::vector<int64_t>{0}));
  EXPECT_TRUE(cache.find({0, 2, 3, 4, 5, 6, 7, 8, 40}, bm).empty());
  // The same second block's ids after another first block are another prefix.
  EXPECT_TRUE(cache.find({9, 9, 9, 9, 5, 6, 7, 8, 40}, bm).empty());
  // A context of exactly the 8 ids keeps its last block to prefill; one of fewer ids finds nothing.
  EXPECT_EQ(cache.find({1, 2, 3, 4, 5, 6, 7, 8}, bm), (std::vector<int64_t>{0}));
  EXPECT_TRUE(cache.find({1, 2, 3, 4}, bm).empty());
}

// blocks_in_common counts what find() would return once the other context's prefill is recorded.
TEST(PrefixCache, BlocksInCommonAreWhatFindWouldReturnAfterTheOthersPrefill) {
  BlockManager bm(16, 4);
  PrefixCache cache(4);
  const std::vector<int64_t> a = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
  const std::vector<std::vector<int64_t>> others = {
      {1, 2, 3, 4, 5, 6, 7, 8, 40}, {1, 2, 3, 4, 5, 6, 7, 9, 40}, {0, 2, 3, 4}, {1, 2, 3, 4, 5, 6, 7, 8}, {1, 2, 3, 4}, {}};
  const int64_t s = bm.admit(static_cast<int64_t>(a.size()), 1, 16).front();
  cache.record(a, bm.table(s), 2, bm);
  for (const auto& ids : others)
    EXPECT_EQ(cache.blocks_in_common(ids, a), static_cast<int64_t>(cache.find(ids, bm).size())) << ids.size() << " ids";
  EXPECT_EQ(cache.blocks_in_common(a, a), 2);  // its last position left out: 2 whole blocks, not 2.75
}

TEST(PrefixCache, ForgetsBlocksThatWereFreedOrTakenAgain) {
  BlockManager bm(8, 2);
  PrefixCache cache(2);
  const std::vector<int64_t> a = {1, 2, 3, 4, 5};
  const int64_t s = bm.admit(5, 1, 5).front();
  cache.record(a, bm.table(s), 2, bm);
  ASSERT_EQ(cache.find(a, bm).size(), 2u);
  bm.release(s);
  EXPECT_TRUE(cache.find(a, bm).empty());  // free: its contents may be overwritten at any time
  // Taken again (the lowest free blocks first: the same ids 0 and 1) and written with other ids: held, but
  // not what was recorded.
  const int64_t other = bm.admit(5, 1, 5).front();
  ASSERT_EQ(bm.table(other)[0], 0);
  EXPECT_TRUE(cache.find(a, bm).empty());
  cache.record({7, 7, 7, 7, 7}, bm.table(other), 2, bm);
  EXPECT_EQ(cache.find({7, 7, 7, 7, 1}, bm), (std::vector<int64_t>{0, 1}));
  EXPECT_TRUE(cache.find(a, bm).empty());
}

TEST(PrefixCache, TheFirstBlockRecordedForAPrefixStaysTheOneFound) {
  BlockManager bm(8, 2);
  PrefixCache cache(2);
  const std::vector<int64_t> a = {1, 2, 3, 4, 5};
  const int64_t s = bm.admit(5, 1, 5).front(), t = bm.admit(5, 1, 5).front();
  cache.record(a, bm.table(s), 2, bm);
  cache.record(a, bm.table(t), 2, bm);  // the same ids prefilled twice before either found the other
  ASSERT_EQ(bm.table(s), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(cache.find(a, bm), (std::vector<int64_t>{0, 1}));
  bm.release(s);
  // Once s's blocks are gone, t's are recorded by its next record.
  EXPECT_TRUE(cache.find(a, bm).empty());
  cache.record(a, bm.table(t), 2, bm);
  ASSERT_EQ(bm.table(t), (std::vector<int64_t>{3, 4, 5}));
  EXPECT_EQ(cache.find(a, bm), (std::vector<int64_t>{3, 4}));
}

TEST(PrefixCache, RejectsBadArguments) {
  EXPECT_NE(error_of([] { PrefixCache(0); }).find("block_size"), std::string::npos);
  BlockManager bm(4, 2);
  PrefixCache cache(2);
  const int64_t s = bm.admit(3, 1, 4).front();
  EXPECT_NE(error_of([&] { cache.record({1, 2, 3}, bm.table(s), 2, bm); }).find("full blocks"), std::string::npos);
  EXPECT_NE(error_of([&] { cache.find({1, 2, 3}, BlockManager(4, 4)); }).find("blocks of 2"), std::string::npos);
}

}  // namespace
}  // namespace hybridflow
