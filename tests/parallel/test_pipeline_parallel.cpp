// The model-free pipeline pieces: the 1F1B order of every stage and the split of layers over stages.
#include <gtest/gtest.h>

#include <set>

#include "hybridflow/core/error.h"
#include "hybridflow/parallel/pipeline_parallel.h"
#include "support/error_of.h"

namespace hybridflow {
namespace {

TEST(OneForwardOneBackward, WarmsUpFillsAndDrainsAsMegatronsSchedule) {
  // Two stages, three micro-batches: the first stage runs one forward ahead, the last alternates.
  EXPECT_EQ(to_string(one_forward_one_backward({0, 2}, 3)), "F0 F1 B0 F2 B1 B2");
  EXPECT_EQ(to_string(one_forward_one_backward({1, 2}, 3)), "F0 B0 F1 B1 F2 B2");
  // Four stages: stage s warms up with 3 - s forwards.
  EXPECT_EQ(to_string(one_forward_one_backward({0, 4}, 5)), "F0 F1 F2 F3 B0 F4 B1 B2 B3 B4");
  EXPECT_EQ(to_string(one_forward_one_backward({2, 4}, 5)), "F0 F1 B0 F2 B1 F3 B2 F4 B3 B4");
  // Fewer micro-batches than stages: all forwards, then all backwards.
  EXPECT_EQ(to_string(one_forward_one_backward({0, 4}, 2)), "F0 F1 B0 B1");
  EXPECT_TRUE(one_forward_one_backward({0, 1}, 0).empty());
}

TEST(OneForwardOneBackward, EveryMicroBatchRunsForwardBeforeBackwardAndHoldsAtMostStagesLeftActivations) {
  for (int stages : {1, 2, 3, 4}) {
    for (int stage = 0; stage < stages; ++stage) {
      for (int64_t m : {1, 2, 3, 4, 7, 8}) {
        const auto ops = one_forward_one_backward({stage, stages}, m);
        ASSERT_EQ(static_cast<int64_t>(ops.size()), 2 * m);
        std::set<int64_t> live;
        int64_t next_forward = 0, next_backward = 0;
        size_t peak = 0;
        for (const auto& op : ops) {
          if (op.kind == PipelineOp::kForward) {
            EXPECT_EQ(op.micro_batch, next_forward++);  // forwards in order
            live.insert(op.micro_batch);
          } else {
            EXPECT_EQ(op.micro_batch, next_backward++);  // backwards in order
            EXPECT_EQ(live.erase(op.micro_batch), 1u) << "backward before its forward";
          }
          peak = std::max(peak, live.size());
        }
        EXPECT_LE(static_cast<int64_t>(peak), std::min<int64_t>(stages - stage, m))
            << "stage " << stage << " of " << stages << ", " << m << " micro-batches";
      }
    }
  }
}

TEST(StageLayers, SplitsConsecutivelyAndNamesTheKeyWhenUneven) {
  EXPECT_EQ(stage_layers(8, {0, 4}).start, 0);
  EXPECT_EQ(stage_layers(8, {3, 4}).start, 6);
  EXPECT_EQ(stage_layers(8, {3, 4}).length, 2);
  EXPECT_EQ(stage_layers(5, {0, 1}).length, 5);
  const std::string uneven = testing::error_of([] { stage_layers(6, {0, 4}); });
  EXPECT_NE(uneven.find("num_hidden_layers = 6"), std::string::npos) << uneven;
  EXPECT_NE(uneven.find("pipeline_model_parallel_size"), std::string::npos) << uneven;
  const std::string too_few = testing::error_of([] { stage_layers(2, {0, 4}); });
  EXPECT_NE(too_few.find("fewer than the 4 pipeline stages"), std::string::npos) << too_few;
}

}  // namespace
}  // namespace hybridflow
