// The bounded buffer between a streaming rollout and the trainer (engine/group_buffer.h): the producer
// pauses while it is full, the trainer takes groups in the order they ended, and a group begun more than
// `staleness` versions before the trainer's is never handed out but set aside to be generated again.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "hybridflow/core/error.h"
#include "hybridflow/engine/group_buffer.h"

namespace hybridflow {
namespace {

BufferedGroup group_of(int64_t prompt_id, int64_t begin_version) {
  BufferedGroup g;
  g.prompt_id = prompt_id;
  g.begin_version = begin_version;
  g.group.prompt = prompt_id;
  g.group.tokens = {{prompt_id, 1}, {prompt_id, 2}};
  return g;
}

std::vector<int64_t> ids_of(const std::vector<BufferedGroup>& groups) {
  std::vector<int64_t> ids;
  for (const auto& g : groups) ids.push_back(g.prompt_id);
  return ids;
}

// Waits up to a few seconds for `done` (the machine may be loaded).
template <class F>
bool eventually(F done) {
  for (int i = 0; i < 500 && !done(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  return done();
}

TEST(GroupBuffer, TheProducerPausesWhileFullAndGoesOnWhenTheTrainerTakes) {
  GroupBuffer buffer(3, /*staleness=*/2);
  std::atomic<int64_t> pushed{0};
  std::thread producer([&] {
    for (int64_t i = 0; i < 7; ++i) {
      ASSERT_TRUE(buffer.push(group_of(i, 0)));
      ++pushed;
    }
  });
  ASSERT_TRUE(eventually([&] { return pushed.load() == 3 && buffer.stats().pauses == 1; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(pushed.load(), 3);  // paused: the fourth waits for room
  EXPECT_EQ(buffer.size(), 3);
  EXPECT_EQ(ids_of(buffer.snapshot()), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(ids_of(buffer.take(2, 1)), (std::vector<int64_t>{0, 1}));
  ASSERT_TRUE(eventually([&] { return pushed.load() == 5; }));
  EXPECT_EQ(ids_of(buffer.take(3, 2)), (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(ids_of(buffer.take(2, 2)), (std::vector<int64_t>{5, 6}));  // waits for the producer's last two
  producer.join();
  const GroupBuffer::Stats stats = buffer.stats();
  // pushed, taken, the most held at once, rejected as stale
  EXPECT_EQ((std::vector<int64_t>{stats.pushed, stats.taken, stats.peak, stats.dropped_stale}),
            (std::vector<int64_t>{7, 7, 3, 0}));
  EXPECT_GE(stats.pauses, 2);
  EXPECT_GT(stats.paused_seconds, 0.0);
}

// Staleness 1: at trainer version 3 a group begun at version 1 is too old (1 + 1 < 3) and one begun at 2 is
// not; the old ones go to the stale list, counted, and the take waits for fresh ones.
TEST(GroupBuffer, GroupsOlderThanTheBoundAreSetAsideNeverTrained) {
  GroupBuffer buffer(4, /*staleness=*/1);
  ASSERT_TRUE(buffer.push(group_of(10, 1)));
  ASSERT_TRUE(buffer.push(group_of(11, 2)));
  ASSERT_TRUE(buffer.push(group_of(12, 1)));
  ASSERT_TRUE(buffer.push(group_of(13, 3)));
  EXPECT_EQ(ids_of(buffer.take(2, 3)), (std::vector<int64_t>{11, 13}));
  EXPECT_EQ(ids_of(buffer.take_stale()), (std::vector<int64_t>{10, 12}));
  EXPECT_TRUE(buffer.take_stale().empty());
  EXPECT_EQ(buffer.stats().dropped_stale, 2);

  // A take that finds too few fresh groups waits; a fresh push completes it.
  ASSERT_TRUE(buffer.push(group_of(14, 2)));
  std::vector<BufferedGroup> got;
  std::thread trainer([&] { got = buffer.take(2, 3); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_TRUE(got.empty());
  ASSERT_TRUE(buffer.push(group_of(15, 3)));
  trainer.join();
  EXPECT_EQ(ids_of(got), (std::vector<int64_t>{14, 15}));
  // Staleness 0: only the trainer's own version trains.
  GroupBuffer strict(2, 0);
  ASSERT_TRUE(strict.push(group_of(1, 4)));
  ASSERT_TRUE(strict.push(group_of(2, 5)));
  EXPECT_EQ(ids_of(strict.take(1, 5)), (std::vector<int64_t>{2}));
  EXPECT_EQ(ids_of(strict.take_stale()), (std::vector<int64_t>{1}));
}

TEST(GroupBuffer, CloseWakesBothSidesAndBadSizesAreRefused) {
  GroupBuffer buffer(1, 0);
  ASSERT_TRUE(buffer.push(group_of(0, 0)));
  bool accepted = true;
  std::thread producer([&] { accepted = buffer.push(group_of(1, 0)); });
  ASSERT_TRUE(eventually([&] { return buffer.stats().pauses == 1; }));
  buffer.close();
  producer.join();
  EXPECT_FALSE(accepted);
  EXPECT_EQ(ids_of(buffer.take(1, 0)), (std::vector<int64_t>{0}));
  EXPECT_TRUE(buffer.take(1, 0).empty());  // closed and empty: returns at once
  EXPECT_THROW(buffer.take(2, 0), Error);  // more than the buffer holds could never be ready
  EXPECT_THROW(GroupBuffer(0, 1), Error);
  EXPECT_THROW(GroupBuffer(1, -1), Error);
}

}  // namespace
}  // namespace hybridflow
