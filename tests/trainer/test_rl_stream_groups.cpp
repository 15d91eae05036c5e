// Streamed groups (actor_rollout_ref.rollout.stream_groups) over real worker processes: a standalone
// rollout running ahead starts the next step's prompts in the slots its batch's short responses free, returns
// the first batch of groups to end and carries the others to the next call. Every sample stays within the
// staleness bound, and on-policy the key changes nothing.
#include <gtest/gtest.h>

#include "hybridflow/core/jsonl.h"
#include "hybridflow/runtime/worker_main.h"
#include "hybridflow/trainer/rl_trainer.h"
#include "hybridflow/workers/rl_workers.h"
#include "support/deterministic_metrics.h"
#include "support/error_of.h"
#include "support/temp_dir.h"
#include "support/tiny_rl_config.h"

using namespace hybridflow;

static const bool kRanAsWorker = (register_rl_workers(), run_worker_if_requested());

namespace {

constexpr int kStreamSteps = 6;

struct StreamRun {
  std::vector<nlohmann::json> metrics;
  double actor_norm = 0, rollout_norm = 0;
};

StreamRun train_streaming(bool stream, const std::string& staleness) {
  hybridflow::testing::TempDir dir;
  RLTrainer trainer(load_rl_config(
      "", hybridflow::testing::tiny_rl_overrides(
              "grpo", {"trainer.placement=standalone", "trainer.total_steps=" + std::to_string(kStreamSteps),
                       "trainer.run_dir=" + dir.path(), "trainer.log_samples_freq=0", "data.train_batch_size=4",
                       "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.optim.lr=2e-2",
                       "actor_rollout_ref.rollout.response_length=64", "actor_rollout_ref.rollout.max_num_seqs=4",
                       "actor_rollout_ref.rollout.staleness=" + staleness,
                       std::string("actor_rollout_ref.rollout.stream_groups=") + (stream ? "true" : "false")})));
  trainer.fit();
  return {read_jsonl(dir.path() + "/metrics.jsonl"), trainer.parameter_sq_norm("actor"),
          trainer.parameter_sq_norm("rollout")};
}

// Staleness 2: the pool's queue holds the next steps' requests, so a call finds the next step's prompts
// published and starts some of them. A call returns the first batch of groups to end, whichever step drew
// them, and carries the rest, which later calls continue. No token is more than 2 updates old, and the pool
// ends with the actor's weights.
TEST(StreamGroups, TheTrainerTakesTheFirstGroupsToEndWithinTheStalenessBound) {
  const StreamRun run = train_streaming(true, "2");
  ASSERT_EQ(run.metrics.size(), static_cast<size_t>(kStreamSteps));
  double continued = 0, ahead = 0, carried = 0;
  for (int i = 0; i < kStreamSteps; ++i) {
    const auto& m = run.metrics[static_cast<size_t>(i)];
    EXPECT_LE(m.at("rollout/token_staleness_max").get<double>(), 2) << "step " << i + 1;
    EXPECT_LE(m.at("rollout/staleness_max").get<double>(), 2) << "step " << i + 1;
    // The staleness histograms over 0..2, per sample and per token, each whole, and 0 beyond the maximum.
    for (const std::string prefix : {"rollout/staleness_share_", "rollout/token_staleness_share_"}) {
      double whole = 0;
      for (int d = 0; d <= 2; ++d) whole += m.at(prefix + std::to_string(d)).get<double>();
      EXPECT_NEAR(whole, 1.0, 1e-9) << prefix << " at step " << i + 1;
      EXPECT_FALSE(m.contains(prefix + "3"));
    }
    EXPECT_GT(m.at("rollout/token_staleness_share_" + std::to_string(static_cast<int>(
                      m.at("rollout/token_staleness_max").get<double>()))).get<double>(), 0) << "step " << i + 1;
    continued += m.at("rollout/streamed_groups").get<double>();
    ahead += m.at("rollout/stream_groups_ahead").get<double>();
    carried += m.at("rollout/stream_groups_carried").get<double>();
  }
  EXPECT_EQ(run.metrics[0].at("rollout/streamed_groups").get<double>(), 0);  // nothing came before step 1
  EXPECT_GT(continued, 0) << "no call continued groups an earlier call began";
  EXPECT_GT(ahead, 0) << "no batch held a later step's groups that ended first";
  EXPECT_GT(carried, 0) << "no call left a begun group for the next";
  EXPECT_EQ(run.metrics.back().at("rollout/stream_groups_carried").get<double>(), 0) << "the last step left groups";
  EXPECT_EQ(run.rollout_norm, run.actor_norm);
}

// On-policy nothing runs ahead: the key leaves the run as it was, bit for bit.
TEST(StreamGroups, OnPolicyTheKeyChangesNothing) {
  const StreamRun off = train_streaming(false, "0");
  const StreamRun on = train_streaming(true, "0");
  ASSERT_EQ(on.metrics.size(), off.metrics.size());
  for (size_t i = 0; i < off.metrics.size(); ++i) {
    const nlohmann::json want = hybridflow::testing::deterministic_metrics(off.metrics[i]);
    EXPECT_GT(want.size(), 15u);
    EXPECT_EQ(hybridflow::testing::deterministic_metrics(on.metrics[i]), want) << "step " << i + 1;
  }
  EXPECT_EQ(on.actor_norm, off.actor_norm);
}

TEST(StreamGroups, NeedsAStandaloneRolloutOfOneProcessWithoutPartialRollouts) {
  hybridflow::testing::TempDir dir;
  for (const std::vector<std::string>& extra :
       {std::vector<std::string>{}, std::vector<std::string>{"trainer.placement=standalone",
                                                             "actor_rollout_ref.rollout.partial_rollout=true"}}) {
    std::vector<std::string> options = {"trainer.run_dir=" + dir.path(), "actor_rollout_ref.rollout.stream_groups=true"};
    options.insert(options.end(), extra.begin(), extra.end());
    const std::string message = hybridflow::testing::error_of(
        [&] { RLTrainer trainer(load_rl_config("", hybridflow::testing::tiny_rl_overrides("grpo", options))); });
    EXPECT_NE(message.find("stream_groups = true needs a standalone rollout"), std::string::npos) << message;
  }
}

}  // namespace
