// `hybridflow train` tells the user where it saved checkpoints and where it resumed from, and running
// the same command again continues the run instead of starting over.
#include <gtest/gtest.h>

#include <filesystem>
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

// `train --check`: the run as it would start, checked as a run checks it, with nothing written and no worker
// started; a config that a run would refuse fails the same way; after a run it names the checkpoint it would
// resume from.
TEST(CliCheck, ChecksWithoutWritingAndNamesTheCheckpointItWouldResume) {
  hybridflow::testing::TempDir dir;
  const std::string run = dir.file("run");
  CommandResult ok = run_hybridflow(tiny_grpo(run) + " trainer.total_steps=2 --check");
  ASSERT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_TRUE(contains(ok.output, "config ok: program grpo (adv_estimator grpo) on cpu")) << ok.output;
  EXPECT_TRUE(contains(ok.output, "data: 16 training prompts, 2 held-out; 2 prompts x 2 samples of up to 4 tokens a "
                                  "step, 2 steps")) << ok.output;
  EXPECT_TRUE(contains(ok.output, "pool 'global' (1 process): actor")) << ok.output;
  EXPECT_FALSE(contains(ok.output, "step 1/2")) << ok.output;
  EXPECT_FALSE(std::filesystem::exists(run)) << "--check wrote the run directory";

  CommandResult bad = run_hybridflow(tiny_grpo(run) + " actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3 --check");
  EXPECT_EQ(bad.exit_code, 1) << bad.output;
  EXPECT_TRUE(contains(bad.output, "ppo_micro_batch_size(_per_gpu) = 3 samples per process do not divide")) << bad.output;
  EXPECT_FALSE(std::filesystem::exists(run));

  ASSERT_EQ(run_hybridflow(tiny_grpo(run) + " trainer.total_steps=2").exit_code, 0);
  CommandResult again = run_hybridflow(tiny_grpo(run) + " trainer.total_steps=4 --check");
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_TRUE(contains(again.output, "would resume from " + run + "/checkpoints/step_2")) << again.output;
}
