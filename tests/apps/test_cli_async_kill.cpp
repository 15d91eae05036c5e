// A streaming (staleness 2) `hybridflow train` killed with SIGKILL at several moments - right after a step's
// metrics line, before its checkpoint, and a little later, mid-step or mid-save - and run again each time
// until it finishes: the resumed run trains every prompt of the epoch exactly as often as an uninterrupted
// run, none lost with the rollouts buffered or in flight at a kill, none trained twice. With and without
// partial rollouts, and with streamed groups (a step's samples started by the call before and carried over
// in the rollout process, which the kills throw away).
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "hybridflow/core/fs.h"
#include "hybridflow/core/jsonl.h"
#include "support/kill_run.h"
#include "support/process_tree.h"
#include "support/run_command.h"
#include "support/temp_dir.h"
#include "support/tiny_rl_config.h"

namespace {

using hybridflow::testing::lines_in;
using hybridflow::testing::prompt_uses;

// One epoch: 16 prompts, 2 per step, 2 samples each, every sample logged; a checkpoint after every step.
enum class Rollouts { kWhole, kPartial, kStreamGroups };

std::string streaming_run(const std::string& run_dir, Rollouts mode) {
  return "train algorithm.adv_estimator=grpo " + hybridflow::testing::tiny_rl_model_args() +
         " data.task=addition data.train_size=16 data.test_size=0 data.train_batch_size=2 "
         "actor_rollout_ref.rollout.n=2 actor_rollout_ref.rollout.response_length=24 "
         "actor_rollout_ref.actor.ppo_mini_batch_size=2 trainer.placement=standalone "
         "actor_rollout_ref.rollout.staleness=2 actor_rollout_ref.rollout.partial_rollout=" +
         std::string(mode == Rollouts::kPartial ? "true" : "false") + " actor_rollout_ref.rollout.stream_groups=" +
         std::string(mode == Rollouts::kStreamGroups ? "true" : "false") +
         " trainer.total_steps=8 trainer.save_freq=1 trainer.log_samples_freq=1 trainer.log_samples_count=64 "
         "trainer.run_dir=" +
         run_dir;
}

void expect_kills_lose_and_duplicate_no_prompt(Rollouts mode) {
  hybridflow::testing::TempDir dir;
  const std::string straight = dir.file("straight"), killed = dir.file("killed"), log = dir.file("killed.log");
  const auto uninterrupted = hybridflow::testing::run_hybridflow(streaming_run(straight, mode));
  ASSERT_EQ(uninterrupted.exit_code, 0) << uninterrupted.output;
  const std::map<std::string, int> want = prompt_uses(straight);
  int64_t samples = 0;
  for (const auto& [prompt, uses] : want) samples += uses;
  ASSERT_EQ(samples, 8 * 2 * 2) << "8 steps of 2 prompts with 2 samples each";
  if (mode == Rollouts::kStreamGroups) {
    double streamed = 0;  // groups a call started for the step after it
    for (const auto& record : hybridflow::read_jsonl(straight + "/metrics.jsonl"))
      streamed += record.at("rollout/streamed_groups").get<double>();
    EXPECT_GT(streamed, 0) << "no call started the next step's prompts";
  }

  const std::string command = std::string(HF_BINARY) + " " + streaming_run(killed, mode);
  // (metrics lines, then a delay): right after step 1's line (before its checkpoint), mid-step 4 and later.
  const std::vector<std::pair<int64_t, int>> moments = {{1, 0}, {3, 7}, {5, 19}, {6, 2}};
  int landed = 0;
  for (const auto& [lines, delay_ms] : moments) {
    if (lines_in(killed + "/metrics.jsonl") >= 8) break;
    const auto after_lines = [&killed, lines = lines] { return lines_in(killed + "/metrics.jsonl") >= lines; };
    landed += hybridflow::testing::kill_run_when(command, after_lines, std::chrono::milliseconds(delay_ms), log);
  }
  EXPECT_GE(landed, 2) << "the kills came after the run had ended:\n" << hybridflow::read_file(log);
  const auto last = hybridflow::testing::run_hybridflow(streaming_run(killed, mode));
  ASSERT_EQ(last.exit_code, 0) << last.output;
  EXPECT_NE(last.output.find("resumed from checkpoint"), std::string::npos) << last.output;

  std::vector<int64_t> steps;
  for (const auto& record : hybridflow::read_jsonl(killed + "/metrics.jsonl")) steps.push_back(record.at("step"));
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(prompt_uses(killed), want) << "a prompt was lost or trained twice across the kills";
}

}  // namespace

TEST(CliAsyncKill, StreamingRunKilledAndResumedTrainsEveryPromptExactlyOnce) {
  expect_kills_lose_and_duplicate_no_prompt(Rollouts::kWhole);
}

TEST(CliAsyncKill, PartialRolloutRunKilledAndResumedTrainsEveryPromptExactlyOnce) {
  expect_kills_lose_and_duplicate_no_prompt(Rollouts::kPartial);
}

TEST(CliAsyncKill, StreamedGroupsRunKilledAndResumedTrainsEveryPromptExactlyOnce) {
  expect_kills_lose_and_duplicate_no_prompt(Rollouts::kStreamGroups);
}
