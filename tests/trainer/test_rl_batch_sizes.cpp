// verl's batch-size semantics (trainer/rl_batch_sizes.h): mini-batches count prompts over all processes,
// a micro-batch key counts samples over all data-parallel ranks and its _per_gpu twin per process.
#include <gtest/gtest.h>

#include "hybridflow/trainer/rl_trainer.h"
#include "support/error_of.h"
#include "trainer/rl_batch_sizes.h"

using namespace hybridflow;
using hybridflow::testing::error_of;

namespace {
const std::string kMicro = "actor_rollout_ref.actor.ppo_micro_batch_size";
const std::string kMini = "actor_rollout_ref.actor.ppo_mini_batch_size";
}  // namespace

TEST(RlBatchSizes, MiniBatchCountsPromptsOverAllRanks) {
  // 8 prompts x 4 samples = 32 samples, over 2 ranks: 16 each.
  EXPECT_EQ(mini_batch_rows_per_process(load_rl_config("", {kMini + "=8"}), kMini, 4, 2), 16);
  // 3 prompts x 1 sample over 2 ranks does not divide; the error names the key and the numbers.
  const std::string bad = error_of([] { mini_batch_rows_per_process(load_rl_config("", {kMini + "=3"}), kMini, 1, 2); });
  EXPECT_NE(bad.find(kMini + " = 3 prompts x rollout.n = 1 = 3 samples do not divide across the role's 2"),
            std::string::npos) << bad;
}

TEST(RlBatchSizes, GlobalMicroBatchIsSplitOverRanksAndPerGpuIsTakenAsIs) {
  EXPECT_EQ(micro_batch_rows_per_process(load_rl_config("", {kMicro + "=8"}), kMicro, 2, 99), 4);
  EXPECT_EQ(micro_batch_rows_per_process(load_rl_config("", {kMicro + "_per_gpu=3"}), kMicro, 2, 99), 3);
  EXPECT_EQ(micro_batch_rows_per_process(load_rl_config("", {}), kMicro, 2, 99), 99);  // neither set
  const std::string both =
      error_of([] { micro_batch_rows_per_process(load_rl_config("", {kMicro + "=8", kMicro + "_per_gpu=2"}), kMicro, 2, 1); });
  EXPECT_NE(both.find(kMicro + " (samples over all data-parallel ranks) = 8 and " + kMicro + "_per_gpu (per process) = 2"),
            std::string::npos) << both;
  const std::string uneven = error_of([] { micro_batch_rows_per_process(load_rl_config("", {kMicro + "=6"}), kMicro, 4, 1); });
  EXPECT_NE(uneven.find(kMicro + " = 6 samples do not divide across the role's 4 data-parallel ranks"), std::string::npos)
      << uneven;
  const std::string zero = error_of([] { micro_batch_rows_per_process(load_rl_config("", {kMicro + "_per_gpu=0"}), kMicro, 1, 1); });
  EXPECT_NE(zero.find(kMicro + "_per_gpu must be > 0, got 0"), std::string::npos) << zero;
}

TEST(RlBatchSizes, MicroBatchMustSplitTheMiniBatch) {
  check_micro_divides_mini(16, 4, kMini, kMicro);
  check_micro_divides_mini(4, 16, kMini, kMicro);  // larger than the mini-batch: the whole mini-batch at once
  const std::string bad = error_of([] { check_micro_divides_mini(16, 6, kMini, kMicro); });
  EXPECT_NE(bad.find(kMicro + " = 6 samples per process do not divide " + kMini + "'s 16"), std::string::npos) << bad;
}
