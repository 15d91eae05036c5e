// What a run does when a value goes bad: a scorer's inf or NaN, a non-finite gradient norm, a huge reward.
// Each either stops with a message naming the step, the scorer and the value, or skips and counts the
// update; the metrics line is always written.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>

#include "hybridflow/core/error.h"
#include "hybridflow/core/fs.h"
#include "hybridflow/core/jsonl.h"
#include "hybridflow/runtime/worker_main.h"
#include "hybridflow/trainer/checkpoint.h"
#include "hybridflow/trainer/rl_trainer.h"
#include "hybridflow/workers/rl_workers.h"
#include "support/error_of.h"
#include "support/temp_dir.h"
#include "support/tiny_rl_config.h"

using namespace hybridflow;

static const bool kRanAsWorker = (register_rl_workers(), run_worker_if_requested());

using hybridflow::testing::error_of;
using hybridflow::testing::tiny_rl_overrides;

namespace {

// A reward command printing `value` for every response.
std::vector<std::string> constant_reward(const std::string& value) {
  return {"reward.type=command", "reward.shell=while read line; do echo " + value + "; done"};
}

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace

TEST(RlFaults, HugeRewardSkipsTheNonFiniteUpdateCountsItAndStillWritesTheMetricsLine) {
  // 1e20 fits a float, but the critic's squared error does not: its loss and gradient norm are inf. Before,
  // the worker's inf metric arrived as JSON null and the run died with "type must be number, but is null".
  hybridflow::testing::TempDir dir;
  RLTrainer trainer(load_rl_config(
      "", tiny_rl_overrides("gae", with(constant_reward("1e20"), {"trainer.run_dir=" + dir.path()}))));
  const double critic_before = trainer.parameter_sq_norm("critic");
  nlohmann::json record = trainer.step();
  ASSERT_TRUE(record.contains("train/nonfinite_updates")) << record.dump();
  EXPECT_GE(record["train/nonfinite_updates"].get<double>(), 1.0) << record.dump();
  ASSERT_TRUE(record.contains("critic/skipped_steps")) << record.dump();
  // The skipped optimizer step touched no weight.
  EXPECT_EQ(trainer.parameter_sq_norm("critic"), critic_before);
  EXPECT_TRUE(record["critic/grad_norm"].is_null()) << record.dump();  // inf is written as null
  const auto lines = read_jsonl(dir.path() + "/metrics.jsonl");
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0].at("step"), 1);
  EXPECT_TRUE(lines[0].at("critic/grad_norm").is_null());
}

TEST(RlFaults, AHealthyStepCountsNoNonFiniteUpdate) {
  RLTrainer trainer(load_rl_config("", tiny_rl_overrides("grpo")));
  nlohmann::json record = trainer.step();
  EXPECT_EQ(record.at("train/nonfinite_updates").get<double>(), 0.0) << record.dump();
  EXPECT_FALSE(record.contains("actor/skipped_steps"));
}

TEST(RlFaults, AnInfiniteScoreStopsTheRunNamingStepScorerRowAndValue) {
  // 1e39 is a valid JSON number but no float: the scores tensor would hold inf.
  RLTrainer trainer(load_rl_config("", tiny_rl_overrides("grpo", constant_reward("1e39"))));
  const std::string message = error_of([&] { trainer.step(); });
  for (const char* part : {"step 1", "reward.type command", "row 0", "inf", "reward_model.reward_clip"})
    EXPECT_NE(message.find(part), std::string::npos) << part << " missing in: " << message;
}

TEST(RlFaults, RewardClipClampsScoresIntoTheRangeAndCountsThem) {
  RLTrainer trainer(load_rl_config(
      "", tiny_rl_overrides("grpo", with(constant_reward("1e39"), {"reward_model.reward_clip=[-1, 0.5]"}))));
  nlohmann::json record = trainer.step();
  EXPECT_EQ(record.at("score/max").get<double>(), 0.5);
  EXPECT_EQ(record.at("score/min").get<double>(), 0.5);
  EXPECT_EQ(record.at("score/clipped").get<double>(), 4.0);  // 2 prompts x 2 responses
}

TEST(RlFaults, ABadRewardClipNamesTheKey) {
  for (const char* bad : {"reward_model.reward_clip=[1, -1]", "reward_model.reward_clip=[0]"}) {
    const std::string message =
        error_of([&] { RLTrainer trainer(load_rl_config("", tiny_rl_overrides("grpo", {bad}))); });
    EXPECT_NE(message.find("reward_model.reward_clip"), std::string::npos) << message;
  }
}

namespace {

// A GRPO run of `steps` steps on `run_dir`, checkpointing after each (resumes from the newest intact one).
Config checkpointed_run(const std::string& run_dir, int steps) {
  return load_rl_config("", tiny_rl_overrides("grpo", {"trainer.run_dir=" + run_dir, "trainer.save_freq=1",
                                                       "trainer.total_steps=" + std::to_string(steps)}));
}

}  // namespace

TEST(RlFaults, ResumeFallsBackPastADamagedNewestCheckpointAndSaysWhatIsWrong) {
  hybridflow::testing::TempDir dir;
  RLTrainer(checkpointed_run(dir.path(), 2)).fit();
  const std::string root = dir.path() + "/checkpoints";
  // The newest checkpoint is complete (it has its marker) but its actor weights lost their second half.
  const std::string weights = root + "/step_2/actor/model.safetensors";
  std::filesystem::resize_file(weights, std::filesystem::file_size(weights) / 2);
  ASSERT_TRUE(is_complete_checkpoint(root + "/step_2"));
  EXPECT_EQ(checkpoint_problem(root + "/step_1"), "");
  const std::string problem = checkpoint_problem(root + "/step_2");
  EXPECT_NE(problem.find(weights), std::string::npos) << problem;

  RLTrainer resumed(checkpointed_run(dir.path(), 3));
  EXPECT_EQ(resumed.resumed_from(), root + "/step_1");
  EXPECT_EQ(resumed.steps_done(), 1);
  // Naming the damaged checkpoint itself is an error that says what is wrong.
  const std::string message = error_of([&] { resolve_checkpoint(root + "/step_2"); });
  EXPECT_NE(message.find("damaged"), std::string::npos) << message;
  EXPECT_NE(message.find(weights), std::string::npos) << message;
}

TEST(RlFaults, EveryCheckpointDamagedIsAnErrorNotASilentFreshStart) {
  hybridflow::testing::TempDir dir;
  RLTrainer(checkpointed_run(dir.path(), 1)).fit();
  const std::string root = dir.path() + "/checkpoints";
  write_file_atomic(root + "/step_1/" + kTrainerStateFile, "{\"step\": 1, ");  // cut off mid-write
  EXPECT_NE(checkpoint_problem(root + "/step_1").find(kTrainerStateFile), std::string::npos);
  std::remove((root + "/step_1/rng/controller.safetensors").c_str());
  const std::string message = error_of([&] { RLTrainer again(checkpointed_run(dir.path(), 2)); });
  EXPECT_NE(message.find("every checkpoint under " + root + " is damaged"), std::string::npos) << message;
  EXPECT_NE(message.find(kTrainerStateFile), std::string::npos) << message;  // what is wrong, too
  EXPECT_NE(message.find("trainer.resume_mode=disable"), std::string::npos) << message;
}

TEST(RlFaults, PromptPlusResponseMustFitTheModelsPositionsNamingBothKeys) {
  // The tiny preset has 256 positions; the addition prompts are a few tokens long.
  std::string message = error_of(
      [&] { RLTrainer trainer(load_rl_config("", tiny_rl_overrides("grpo", {"actor_rollout_ref.rollout.response_length=254"}))); });
  for (const char* part : {"data.task 'addition'", "max_position_embeddings = 256", "model.preset 'tiny'",
                           "actor_rollout_ref.rollout.response_length = 254", "data.max_prompt_length"})
    EXPECT_NE(message.find(part), std::string::npos) << part << " missing in: " << message;
  message = error_of([&] {
    RLTrainer trainer(load_rl_config("", tiny_rl_overrides("grpo", {"actor_rollout_ref.rollout.response_length=256"})));
  });
  EXPECT_NE(message.find("leaves no room for a prompt"), std::string::npos) << message;
}
