// Prefix caching's record of which held blocks hold which ids: a chain of whole blocks from position 0,
// matched id for id, always leaving a context's last position to prefill, found while its blocks are held or
// retained, and forgotten when a block is taken again.
#include "hybridflow/engine/prefix_cache.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <string>

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

// A recorded block stays findable after its sequences end (the pool retains it) until it is taken again.
TEST(PrefixCache, FindsFreedBlocksUntilTheyAreTakenAgain) {
  BlockManager bm(3, 2);
  PrefixCache cache(2);
  const std::vector<int64_t> a = {1, 2, 3, 4, 5};
  const int64_t s = bm.admit(5, 1, 5).front();
  cache.record(a, bm.table(s), 2, bm);
  ASSERT_EQ(cache.find(a, bm), (std::vector<int64_t>{0, 1}));
  bm.release(s);
  EXPECT_EQ(cache.find(a, bm), (std::vector<int64_t>{0, 1}));  // retained: nothing has written them since
  EXPECT_EQ(bm.retained_blocks(), 2);
  // The whole pool is needed: block 2 (not recorded), then the retained ones are taken again and written
  // with other ids.
  const int64_t other = bm.admit(5, 1, 5).front();
  ASSERT_EQ(bm.table(other), (std::vector<int64_t>{2, 1, 0}));
  EXPECT_TRUE(cache.find(a, bm).empty());
  cache.record({7, 7, 7, 7, 7}, bm.table(other), 2, bm);
  EXPECT_EQ(cache.find({7, 7, 7, 7, 1}, bm), (std::vector<int64_t>{2, 1}));
  EXPECT_TRUE(cache.find(a, bm).empty());
}

// Retained blocks are taken again a prefix's end first, so what stays findable is its beginning.
TEST(PrefixCache, APrefixLosesItsLastBlocksFirst) {
  BlockManager bm(4, 2);
  PrefixCache cache(2);
  const std::vector<int64_t> a = {1, 2, 3, 4, 5};
  const int64_t s = bm.admit(5, 1, 5).front();
  cache.record(a, bm.table(s), 2, bm);
  bm.release(s);
  const int64_t other = bm.admit(5, 1, 5).front();  // blocks 2 and 3, then retained block 1
  ASSERT_EQ(bm.table(other), (std::vector<int64_t>{2, 3, 1}));
  EXPECT_EQ(cache.find(a, bm), (std::vector<int64_t>{0}));
  bm.release(other);
  // A prompt of a's first block starts on it: held again.
  const int64_t again = bm.admit(3, 1, 3, cache.find({1, 2, 9}, bm)).front();
  EXPECT_EQ(bm.table(again).front(), 0);
  EXPECT_EQ(bm.references(0), 1);
  EXPECT_EQ(bm.retained_blocks(), 0);
}

TEST(PrefixCache, TheFirstBlockRecordedForAPrefixStaysTheOneFound) {
  BlockManager bm(6, 2);
  PrefixCache cache(2);
  const std::vector<int64_t> a = {1, 2, 3, 4, 5};
  const int64_t s = bm.admit(5, 1, 5).front(), t = bm.admit(5, 1, 5).front();
  cache.record(a, bm.table(s), 2, bm);
  cache.record(a, bm.table(t), 2, bm);  // the same ids prefilled twice before either found the other
  ASSERT_EQ(bm.table(s), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(cache.find(a, bm), (std::vector<int64_t>{0, 1}));
  bm.release(s);
  EXPECT_EQ(cache.find(a, bm), (std::vector<int64_t>{0, 1}));  // retained
  // Once s's blocks are taken again, t's are recorded by its next record.
  bm.admit(5, 1, 5);
  EXPECT_TRUE(cache.find(a, bm).empty());
  cache.record(a, bm.table(t), 2, bm);
  ASSERT_EQ(bm.table(t), (std::vector<int64_t>{3, 4, 5}));
  EXPECT_EQ(cache.find(a, bm), (std::vector<int64_t>{3, 4}));
}

// Prompts drawn from a few shared beginnings through a small pool, with the KV cache's contents modelled per
// position: every block find() returns holds exactly the ids the context has there, whether it is held or
// retained, and retained blocks are found (the case this guards) as well as evicted.
TEST(PrefixCache, FoundBlocksAlwaysHoldTheContextsIds) {
  std::mt19937_64 rng(3);
  for (int64_t block_size : {1, 2, 4}) {
    SCOPED_TRACE("block_size " + std::to_string(block_size));
    BlockManager bm(24, block_size);
    PrefixCache cache(block_size);
    std::vector<std::vector<int64_t>> written(24, std::vector<int64_t>(static_cast<size_t>(block_size), -1));
    const std::vector<std::vector<int64_t>> beginnings = {{1, 2, 3, 4, 5, 6, 7, 8}, {1, 2, 3, 4, 9, 9}, {5, 5, 5}};
    std::map<int64_t, int64_t> running;  // sequence -> positions it may still append
    int64_t found_retained = 0, found_total = 0;
    for (int round = 0; round < 400; ++round) {
      std::vector<int64_t> ids = beginnings[rng() % beginnings.size()];
      for (uint64_t k = rng() % 5; k > 0; --k) ids.push_back(10 + static_cast<int64_t>(rng() % 3));
      const auto length = static_cast<int64_t>(ids.size());
      const int64_t n = 1 + static_cast<int64_t>(rng() % 2), most = length + 3;
      const std::vector<int64_t> found = cache.find(ids, bm);
      for (size_t j = 0; j < found.size(); ++j) {
        found_retained += bm.retained(found[j]) ? 1 : 0;
        ++found_total;
        for (int64_t o = 0; o < block_size; ++o)
          ASSERT_EQ(written[static_cast<size_t>(found[j])][static_cast<size_t>(o)],
                    ids[j * static_cast<size_t>(block_size) + static_cast<size_t>(o)])
              << "round " << round << ": found block " << found[j] << " holds other ids";
      }
      if (bm.can_admit(length, n, most, found)) {
        const std::vector<int64_t> seqs = bm.admit(length, n, most, found);
        const std::vector<int64_t>& table = bm.table(seqs.front());
        const auto from = static_cast<int64_t>(found.size()) * block_size;
        for (int64_t p = from; p < length; ++p)  // the prefill writes what was not found
          written[static_cast<size_t>(table[static_cast<size_t>(p / block_size)])][static_cast<size_t>(p % block_size)] =
              ids[static_cast<size_t>(p)];
        cache.record(ids, table, length / block_size, bm);
        for (int64_t q : seqs) running[q] = most - length;
      }
      // Every running sequence decodes a token (writing a marker no context has), and some end.
      std::vector<int64_t> ended;
      for (auto& [q, left] : running) {
        if (left > 0) {
          const BlockManager::Append at = bm.append(q);
          if (at.copy_from >= 0) written[static_cast<size_t>(at.block)] = written[static_cast<size_t>(at.copy_from)];
          written[static_cast<size_t>(at.block)][static_cast<size_t>(at.offset)] = -2;
          --left;
        }
        if (left == 0 || rng() % 3 == 0) ended.push_back(q);
      }
      for (int64_t q : ended) {
        bm.release(q);
        running.erase(q);
      }
      ASSERT_LE(bm.retained_blocks(), bm.free_blocks());
    }
    EXPECT_GT(found_retained, 0);
    EXPECT_GT(found_total, found_retained);
  }
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
