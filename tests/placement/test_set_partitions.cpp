// Placements are set partitions: their count is the Bell number, each covers every role exactly once, and
// no partition repeats.
#include <gtest/gtest.h>

#include <set>

#include "hybridflow/core/error.h"
#include "hybridflow/placement/set_partitions.h"

using namespace hybridflow::placement;

TEST(SetPartitions, BellNumbersFromTheTriangle) {
  const uint64_t expected[] = {1, 1, 2, 5, 15, 52, 203, 877, 4140, 21147};
  for (int n = 0; n < 10; ++n) EXPECT_EQ(bell_number(n), expected[n]) << n;
  EXPECT_EQ(bell_number(25), 4638590332229999353ULL);
  EXPECT_THROW(bell_number(-1), hybridflow::Error);
}

TEST(SetPartitions, EnumerationCountsBellNumbersAndCoversEachElementOnce) {
  for (int n = 0; n <= 7; ++n) {
    std::set<std::vector<std::vector<int>>> seen;
    uint64_t count = 0;
    for_each_set_partition(n, [&](const std::vector<std::vector<int>>& blocks) {
      ++count;
      std::vector<int> hits(static_cast<size_t>(n), 0);
      for (const auto& b : blocks) {
        EXPECT_FALSE(b.empty());
        for (int i : b) ++hits[static_cast<size_t>(i)];
      }
      for (int h : hits) EXPECT_EQ(h, 1);
      EXPECT_TRUE(seen.insert(blocks).second) << "a partition repeats";
      return true;
    });
    EXPECT_EQ(count, bell_number(n)) << n;
  }
}

TEST(SetPartitions, VisitorStopsTheEnumeration) {
  int visited = 0;
  for_each_set_partition(5, [&](const std::vector<std::vector<int>>&) { return ++visited < 3; });
  EXPECT_EQ(visited, 3);
}

TEST(SetPartitions, FirstIsEverythingTogetherAndLastIsAllApart) {
  std::vector<std::vector<std::vector<int>>> all;
  for_each_set_partition(3, [&](const std::vector<std::vector<int>>& b) {
    all.push_back(b);
    return true;
  });
  ASSERT_EQ(all.size(), 5u);
  EXPECT_EQ(all.front(), (std::vector<std::vector<int>>{{0, 1, 2}}));
  EXPECT_EQ(all.back(), (std::vector<std::vector<int>>{{0}, {1}, {2}}));
}
