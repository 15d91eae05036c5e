// `hybridflow train` tells the user where it saved checkpoints and where it resumed from, and running
// the same command again continues the run instead of starting over.
#include <gtest/gtest.h>

#include <string>

#include "hybridflow/core/jsonl.h"
#include "support/run_command.h"
#include "support/temp_dir.h"
#include "support/tiny_rl_config.h"

namespace {

using hybridflow::testing::CommandResult;
using hybridflow::testing::run_hybridflow;

std::string tiny_grpo(const std::string& run_dir) {
  return "train algorithm.adv_estimator=grpo " + hybridflow::testing::tiny_rl_model_args() + " data.task=addition "
         "data.train_size=16 data.test_size=2 data.train_batch_size=2 actor_rollout_ref.rollout.n=2 "
         "actor_rollout_ref.rollout.response_length=4 actor_rollout_ref.actor.ppo_mini_batch_size=2 "
         "trainer.save_freq=2 trainer.run_dir=" +
         run_dir;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST(CliResume, TrainPrintsWhereItSavedAndResumesWhenRunAgain) {
  hybridflow::testing::TempDir dir;
  const std::string ckpts = dir.file("run") + "/checkpoints";
  CommandResult first = run_hybridflow(tiny_grpo(dir.file("run")) + " trainer.total_steps=3");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  EXPECT_TRUE(contains(first.output, "saved checkpoint " + ckpts + "/step_2")) << first.output;
  EXPECT_TRUE(contains(first.output, "checkpoint: " + ckpts + "/step_3")) << first.output;
  EXPECT_FALSE(contains(first.output, "resumed from")) << first.output;

  CommandResult second = run_hybridflow(tiny_grpo(dir.file("run")) + " trainer.total_steps=4");
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_TRUE(contains(second.output, "resumed from checkpoint " + ckpts + "/step_3 at step 3")) << second.output;
  EXPECT_TRUE(contains(second.output, "step 4/4")) << second.output;
  EXPECT_FALSE(contains(second.output, "step 1/4")) << second.output;
  std::vector<int64_t> steps;
  for (const auto& record : hybridflow::read_jsonl(dir.file("run") + "/metrics.jsonl"))
    steps.push_back(record.at("step").get<int64_t>());
  // Step 0 is the first run's validation before training (trainer.val_before_train); the resumed run logs none.
  EXPECT_EQ(steps, (std::vector<int64_t>{0, 1, 2, 3, 4}));
}

TEST(CliResume, AMissingCheckpointIsAnErrorNamingIt) {
  hybridflow::testing::TempDir dir;
  CommandResult r = run_hybridflow(tiny_grpo(dir.file("run")) + " trainer.resume_mode=resume_path trainer.resume_from_path=" +
                 dir.file("no_such_ckpt"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, dir.file("no_such_ckpt"))) << r.output;
}
