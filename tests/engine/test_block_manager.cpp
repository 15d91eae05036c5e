// The paged KV cache's bookkeeping: blocks taken as tokens arrive, a prompt's blocks shared by its samples
// with copy on write of the partial last block, blocks freed at once when a sequence ends, admission only
// within the unreserved free blocks (so no sequence ever runs dry mid-decode), and the budget arithmetic.
#include "hybridflow/engine/block_manager.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>

#include "support/error_of.h"

namespace hybridflow {
namespace {

using testing::error_of;

TEST(BlockManager, BlocksAreTakenAsTokensArrive) {
  BlockManager bm(10, 4);
  const auto ids = bm.admit(5, 1, 12);  // 5 prompt positions: 2 blocks
  ASSERT_EQ(ids.size(), 1u);
  const int64_t s = ids[0];
  EXPECT_EQ(bm.table(s), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(bm.length(s), 5);
  EXPECT_EQ(bm.used_blocks(), 2);
  // Positions 5..7 fill block 1 in place (held by this sequence alone), position 8 takes a new block.
  for (int64_t p = 5; p < 8; ++p) {
    const auto a = bm.append(s);
    EXPECT_EQ(a.block, 1);
    EXPECT_EQ(a.offset, p % 4);
    EXPECT_EQ(a.copy_from, -1);
  }
  EXPECT_EQ(bm.used_blocks(), 2);
  const auto a = bm.append(s);
  EXPECT_EQ(a.block, 2);
  EXPECT_EQ(a.offset, 0);
  EXPECT_EQ(bm.used_blocks(), 3);
  EXPECT_EQ(bm.length(s), 9);
  EXPECT_EQ(bm.table(s), (std::vector<int64_t>{0, 1, 2}));
}

TEST(BlockManager, SamplesSharePromptBlocksAndCopyThePartialOneOnWrite) {
  BlockManager bm(16, 4);
  const auto ids = bm.admit(6, 3, 10);  // blocks 0 (full) and 1 (2 of 4 positions), shared by 3 samples
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(bm.used_blocks(), 2);  // the prompt is stored once
  for (int64_t s : ids) EXPECT_EQ(bm.table(s), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(bm.references(0), 3);
  EXPECT_EQ(bm.references(1), 3);
  // The first two writers copy the shared partial block; the last holder writes into it in place.
  const auto a0 = bm.append(ids[0]);
  EXPECT_EQ(a0.copy_from, 1);
  EXPECT_EQ(a0.block, 2);
  EXPECT_EQ(a0.offset, 2);
  const auto a1 = bm.append(ids[1]);
  EXPECT_EQ(a1.copy_from, 1);
  EXPECT_EQ(a1.block, 3);
  const auto a2 = bm.append(ids[2]);
  EXPECT_EQ(a2.copy_from, -1);
  EXPECT_EQ(a2.block, 1);
  EXPECT_EQ(bm.references(0), 3);  // the full block stays shared for good
  EXPECT_EQ(bm.references(1), 1);
  EXPECT_EQ(bm.table(ids[0]), (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(bm.table(ids[1]), (std::vector<int64_t>{0, 3}));
  EXPECT_EQ(bm.table(ids[2]), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(bm.used_blocks(), 4);
}

TEST(BlockManager, AFullLastPromptBlockIsNeverCopied) {
  BlockManager bm(8, 4);
  const auto ids = bm.admit(8, 2, 12);
  EXPECT_EQ(bm.worst_case_blocks(8, 2, 12), 2 + 2 * 1);  // no copy set aside
  for (int64_t s : ids) {
    const auto a = bm.append(s);
    EXPECT_EQ(a.copy_from, -1);
    EXPECT_EQ(a.offset, 0);
  }
  EXPECT_EQ(bm.references(0), 2);
  EXPECT_EQ(bm.references(1), 2);
  EXPECT_EQ(bm.used_blocks(), 4);
}

TEST(BlockManager, ReleaseFreesBlocksAtOnceAndSharedOnesWithTheLastHolder) {
  BlockManager bm(6, 4);
  const auto ids = bm.admit(3, 2, 6);
  bm.append(ids[0]);  // copies block 0 into block 1
  EXPECT_EQ(bm.used_blocks(), 2);
  bm.release(ids[0]);
  EXPECT_EQ(bm.used_blocks(), 1);  // its copy is free; block 0 is still ids[1]'s
  EXPECT_EQ(bm.references(1), 0);
  EXPECT_EQ(bm.references(0), 1);
  bm.release(ids[1]);
  EXPECT_EQ(bm.used_blocks(), 0);
  EXPECT_EQ(bm.reserved_blocks(), 0);
  EXPECT_EQ(bm.peak_used_blocks(), 2);
  EXPECT_EQ(bm.running(), 0);
  // A freed block is the next one taken.
  const auto next = bm.admit(1, 1, 1);
  EXPECT_EQ(bm.table(next[0]), (std::vector<int64_t>{0}));
  EXPECT_NE(error_of([&] { bm.release(ids[0]); }).find("no running sequence"), std::string::npos);
}

TEST(BlockManager, AdmissionWaitsForUnreservedBlocks) {
  BlockManager bm(10, 4);
  // 5 positions, 3 samples growing to 12: 2 prompt blocks + 3 x (3 - 2 + 1 copy) = 8.
  EXPECT_EQ(bm.worst_case_blocks(5, 3, 12), 8);
  EXPECT_EQ(bm.worst_case_blocks(5, 1, 12), 3);  // alone: no copy
  const auto first = bm.admit(5, 3, 12);
  EXPECT_EQ(bm.used_blocks(), 2);
  EXPECT_EQ(bm.reserved_blocks(), 6);
  // 8 free, 6 of them set aside for the running samples: a 3-block prompt must wait though blocks are free.
  EXPECT_EQ(bm.free_blocks(), 8);
  EXPECT_TRUE(bm.can_admit(4, 1, 8));  // 2 blocks
  EXPECT_FALSE(bm.can_admit(4, 1, 12));
  EXPECT_NE(error_of([&] { bm.admit(4, 1, 12); }).find("needs 3 blocks; 2 of 10"), std::string::npos);
  // Taking reserved blocks does not shrink what is left for others; the last holder of the shared block
  // writes in place and returns the copy it had set aside.
  for (int64_t s : first) bm.append(s);
  EXPECT_EQ(bm.free_blocks() - bm.reserved_blocks(), 3);
  // When a sample ends, its unused reservation and its own blocks return.
  bm.release(first[0]);
  EXPECT_TRUE(bm.can_admit(4, 1, 12));
}

TEST(BlockManager, LastHolderReturnsItsCopyReservation) {
  BlockManager bm(8, 4);
  const auto ids = bm.admit(2, 2, 4);  // 1 prompt block + 2 x (1 - 1 + 1)
  EXPECT_EQ(bm.reserved_blocks(), 2);
  bm.release(ids[0]);  // the other sample is the block's only holder now
  EXPECT_EQ(bm.reserved_blocks(), 1);
  const auto a = bm.append(ids[1]);
  EXPECT_EQ(a.copy_from, -1);
  EXPECT_EQ(a.block, 0);
  EXPECT_EQ(bm.reserved_blocks(), 0);
}

TEST(BlockManager, ASequenceCannotPassItsAdmittedLength) {
  BlockManager bm(4, 2);
  const auto ids = bm.admit(2, 1, 3);
  bm.append(ids[0]);
  EXPECT_NE(error_of([&] { bm.append(ids[0]); }).find("already holds its 3 positions"), std::string::npos);
}

// Positions written ahead (decode steps read back in chunks) and then given back: the blocks past the kept
// positions are free again and return to the sequence's reservation, so it can grow to its admitted length.
TEST(BlockManager, TruncateGivesBackBlocksAndTheirReservation) {
  BlockManager bm(10, 4);
  const auto ids = bm.admit(3, 2, 12);  // a partial prompt block shared by two samples
  const int64_t s = ids[0];
  const int64_t reserved = bm.reserved_blocks();
  // While both samples share the prompt block, neither can give it back.
  EXPECT_NE(error_of([&] { bm.truncate(ids[1], 0); }).find("share"), std::string::npos);
  for (int k = 0; k < 7; ++k) bm.append(s);  // 10 positions: a copy of the prompt block and 2 blocks more
  EXPECT_EQ(bm.table(s).size(), 3u);
  const int64_t used = bm.used_blocks();
  bm.truncate(s, 5);
  EXPECT_EQ(bm.length(s), 5);
  EXPECT_EQ(bm.table(s).size(), 2u);
  EXPECT_EQ(bm.used_blocks(), used - 1);
  EXPECT_EQ(bm.reserved_blocks(), reserved - 2);  // the copy and one block are still held
  for (int k = 0; k < 7; ++k) bm.append(s);  // up to its admitted 12 positions again
  EXPECT_EQ(bm.length(s), 12);
  EXPECT_THROW(bm.append(s), Error);
  EXPECT_THROW(bm.truncate(s, 13), Error);
  bm.release(s);
  bm.release(ids[1]);
  EXPECT_EQ(bm.used_blocks(), 0);
  EXPECT_EQ(bm.reserved_blocks(), 0);
}

// A prompt that begins with full blocks another sequence holds (the prefix cache found them) starts on them:
// a reference per sample, nothing new taken for them, and they outlive their first holder.
TEST(BlockManager, APromptStartsOnHeldBlocksOfACachedPrefix) {
  BlockManager bm(12, 4);
  const int64_t first = bm.admit(9, 1, 12).front();  // blocks 0, 1 full, 2 with one position
  EXPECT_EQ(bm.takes(0), 1);
  // 10 positions, the first 8 in blocks 0 and 1: one new block for the prompt's rest, 3 - 2 more per sample
  // up to 12 positions, and a copy of its partial last block for one of the two samples.
  EXPECT_EQ(bm.worst_case_blocks(10, 2, 12, {0, 1}), 1 + 2 * (3 - 3 + 1));
  const int64_t free_before = bm.free_blocks();
  const auto pair = bm.admit(10, 2, 12, {0, 1});
  EXPECT_EQ(bm.free_blocks(), free_before - 1);
  EXPECT_EQ(bm.table(pair[0]), (std::vector<int64_t>{0, 1, 3}));
  EXPECT_EQ(bm.table(pair[1]), bm.table(pair[0]));
  EXPECT_EQ(bm.length(pair[0]), 10);
  EXPECT_EQ(bm.references(0), 3);
  EXPECT_EQ(bm.references(3), 2);
  bm.release(first);  // the cached blocks stay with the pair; the first holder's own block 2 is freed
  EXPECT_EQ(bm.references(0), 2);
  EXPECT_EQ(bm.references(2), 0);
  bm.release(pair[0]);
  bm.release(pair[1]);
  EXPECT_EQ(bm.used_blocks(), 0);
  EXPECT_EQ(bm.reserved_blocks(), 0);
  // A block taken again counts its takes: what the first taker wrote is gone.
  bm.admit(1, 1, 1);
  EXPECT_EQ(bm.takes(0), 2);
  // Only held (or retained) blocks can be a cached prefix, and at least the prompt's last position is prefilled.
  EXPECT_NE(error_of([&] { bm.admit(9, 1, 9, {5, 6}); }).find("neither held nor retained"), std::string::npos);
  EXPECT_NE(error_of([&] { bm.admit(4, 1, 9, {0}); }).find("at least its last position"), std::string::npos);
}

// A freed block whose contents are kept is retained: it counts as free, blocks holding nothing worth keeping
// are taken before it, and when only retained ones are left the least recently freed goes first, a
// sequence's last block before its first. A prompt may start on a retained block, which is held again.
TEST(BlockManager, KeptBlocksAreRetainedWhenFreedAndTakenLast) {
  BlockManager bm(6, 2);
  const int64_t s = bm.admit(5, 1, 6).front();  // blocks 0, 1 full, 2 partial
  ASSERT_EQ(bm.table(s), (std::vector<int64_t>{0, 1, 2}));
  bm.keep_contents(0);
  bm.keep_contents(1);
  bm.release(s);
  EXPECT_EQ(bm.free_blocks(), 6);
  EXPECT_EQ(bm.used_blocks(), 0);
  EXPECT_EQ(bm.retained_blocks(), 2);
  EXPECT_TRUE(bm.retained(0));
  EXPECT_TRUE(bm.retained(1));
  EXPECT_FALSE(bm.retained(2));
  // Blocks 2-5 hold nothing kept: taken first.
  const int64_t t = bm.admit(7, 1, 7).front();
  EXPECT_EQ(bm.table(t), (std::vector<int64_t>{2, 3, 4, 5}));
  EXPECT_EQ(bm.retained_blocks(), 2);
  EXPECT_EQ(bm.takes(0), 1);
  // Only retained blocks are left: block 1 (freed before block 0, the table's end first) goes first.
  const int64_t u = bm.admit(1, 1, 1).front();
  EXPECT_EQ(bm.table(u), (std::vector<int64_t>{1}));
  EXPECT_EQ(bm.takes(1), 2);
  EXPECT_FALSE(bm.retained(1));
  EXPECT_TRUE(bm.retained(0));
  bm.release(u);  // taken again since its keep_contents: freed as any other block
  EXPECT_FALSE(bm.retained(1));
  bm.release(t);
  // A prompt starting on retained block 0: held again with a reference per sample, not taken again, and it
  // costs one free block as a new one would.
  EXPECT_EQ(bm.worst_case_blocks(4, 2, 4, {0}), 2);
  const int64_t free_before = bm.free_blocks();
  const auto pair = bm.admit(4, 2, 4, {0});
  EXPECT_EQ(bm.table(pair[0]), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(bm.references(0), 2);
  EXPECT_EQ(bm.takes(0), 1);
  EXPECT_FALSE(bm.retained(0));
  EXPECT_EQ(bm.free_blocks(), free_before - 2);
  EXPECT_EQ(bm.peak_used_blocks(), 5);  // t's 4 and u's 1: retained blocks are not counted as used
  // Still kept: retained again when its holders end.
  bm.release(pair[0]);
  bm.release(pair[1]);
  EXPECT_TRUE(bm.retained(0));
  EXPECT_NE(error_of([&] { bm.keep_contents(0); }).find("only a held block"), std::string::npos);
}

// A full pool of retained blocks admits as an empty one would: can_admit counts them free.
TEST(BlockManager, RetainedBlocksNeverStandInTheWayOfAnAdmission) {
  BlockManager bm(4, 2);
  const int64_t s = bm.admit(8, 1, 8).front();
  for (int64_t b : bm.table(s)) bm.keep_contents(b);
  bm.release(s);
  EXPECT_EQ(bm.retained_blocks(), 4);
  EXPECT_TRUE(bm.can_admit(8, 1, 8));
  const int64_t t = bm.admit(8, 1, 8).front();
  EXPECT_EQ(bm.retained_blocks(), 0);
  EXPECT_EQ(bm.table(t), (std::vector<int64_t>{3, 2, 1, 0}));  // the last-freed table end first
  for (int64_t b = 0; b < 4; ++b) EXPECT_EQ(bm.takes(b), 2);
}

TEST(BlockManager, RejectsBadArguments) {
  EXPECT_NE(error_of([] { BlockManager(0, 16); }).find("at least one block"), std::string::npos);
  EXPECT_NE(error_of([] { BlockManager(4, 0); }).find("block_size"), std::string::npos);
  BlockManager bm(4, 2);
  EXPECT_NE(error_of([&] { bm.worst_case_blocks(5, 1, 4); }).find("max_tokens >= prompt_tokens"), std::string::npos);
  EXPECT_NE(error_of([&] { bm.references(4); }).find("no block 4"), std::string::npos);
}

// Many prompts with random lengths and stops through a small pool, admitted only when they fit: no take ever
// fails, every block's reference count equals the tables that name it, a block is written by one sequence
// only (shared ones are never written), reservations stay within the free blocks, and used blocks add up.
TEST(BlockManager, RandomScheduleKeepsTheInvariants) {
  std::mt19937_64 rng(7);
  for (int64_t block_size : {1, 3, 16}) {
    BlockManager bm(80, block_size);
    std::vector<std::pair<int64_t, int64_t>> waiting;  // prompt length, n
    for (int i = 0; i < 60; ++i)
      waiting.push_back({1 + static_cast<int64_t>(rng() % 20), 1 + static_cast<int64_t>(rng() % 4)});
    const int64_t new_tokens = 12;
    std::map<int64_t, int64_t> running;  // id -> positions it may still append
    size_t next = 0;
    int64_t appended = 0;
    while (next < waiting.size() || !running.empty()) {
      while (next < waiting.size() &&
             bm.can_admit(waiting[next].first, waiting[next].second, waiting[next].first + new_tokens)) {
        for (int64_t id : bm.admit(waiting[next].first, waiting[next].second, waiting[next].first + new_tokens))
          running[id] = new_tokens;
        ++next;
      }
      ASSERT_FALSE(running.empty()) << "block_size " << block_size << ": a prompt can never be admitted";
      std::vector<int64_t> ended;
      for (auto& [id, left] : running) {
        const auto a = bm.append(id);
        ++appended;
        ASSERT_EQ(bm.references(a.block), 1) << "a sequence writes into a block it shares";
        if (--left == 0 || rng() % 6 == 0) ended.push_back(id);
      }
      for (int64_t id : ended) {
        bm.release(id);
        running.erase(id);
      }
      std::map<int64_t, int64_t> named;
      for (const auto& [id, left] : running)
        for (int64_t b : bm.table(id)) ++named[b];
      int64_t used = 0;
      for (int64_t b = 0; b < bm.num_blocks(); ++b) {
        ASSERT_EQ(bm.references(b), named.count(b) ? named[b] : 0) << "block " << b;
        used += bm.references(b) > 0 ? 1 : 0;
      }
      ASSERT_EQ(used, bm.used_blocks());
      ASSERT_GE(bm.reserved_blocks(), 0);
      ASSERT_LE(bm.reserved_blocks(), bm.free_blocks());
    }
    EXPECT_EQ(bm.used_blocks(), 0);
    EXPECT_EQ(bm.reserved_blocks(), 0);
    EXPECT_GT(appended, 0);
    EXPECT_LE(bm.peak_used_blocks(), bm.num_blocks());
  }
}

TEST(BlockBudget, BlocksFromAMemoryFractionAndSequencesThatFit) {
  // 0.5 of 1000 bytes less 100 of weights: 400 bytes, 12 blocks of 32 bytes.
  EXPECT_EQ(kv_blocks_in_budget(1000, 0.5, 100, 32), 12);
  EXPECT_EQ(sequences_that_fit(12, 16, 40), 4);  // 3 blocks each
  EXPECT_EQ(sequences_that_fit(12, 16, 48), 4);
  EXPECT_EQ(sequences_that_fit(12, 16, 49), 3);
  EXPECT_NE(error_of([] { kv_blocks_in_budget(1000, 1.5, 0, 32); }).find("gpu_memory_utilization must be in (0, 1]"),
            std::string::npos);
  EXPECT_NE(error_of([] { kv_blocks_in_budget(1000, 0.1, 100, 32); }).find("not one KV block"), std::string::npos);
}

}  // namespace
}  // namespace hybridflow
