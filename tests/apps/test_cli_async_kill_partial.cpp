// A `hybridflow train` with partial rollouts killed with SIGKILL while partial responses are in flight and a
// checkpoint holding some exists, resumed each time until it ends: every prompt of the data is trained
// exactly once (none lost, none twice), and at least one resume really continued saved partial responses.
//
// Why the checkpoints catch responses mid-generation: with trigger_parameter_sync_step 1 the weight sync at
// the end of each step queues behind the generations sent before it, so a checkpoint never finds one in
// flight. Here the weights go to the rollout pool after every second update, and staleness 3 queues the
// rollouts of steps 2-4 beside step 1 (on version 0) with no sync to wait for them at step 1's end, so step
// 1's checkpoint stops them between two tokens; likewise step 3's checkpoint the rollouts queued after the
// sync at step 2. The samples are drawn one at a time (max_num_seqs 1), 64 a step, so the queued rollouts
// usually outlast one update of the 1-layer model. Still, the tiny model generates a step's samples in
// about 0.1 s, and under load a checkpoint may come after the queue has drained (or between two
// rollouts): so kills and resumes are repeated, and one of the resumes must have continued tokens.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "hybridflow/core/data_proto.h"
#include "hybridflow/core/fs.h"
#include "hybridflow/core/jsonl.h"
#include "hybridflow/trainer/checkpoint.h"
#include "support/kill_run.h"
#include "support/process_tree.h"
#include "support/run_command.h"
#include "support/temp_dir.h"
#include "support/tiny_rl_config.h"

namespace {

namespace fs = std::filesystem;
using hybridflow::testing::lines_in;
using hybridflow::testing::prompt_uses;

constexpr int kPrompts = 96, kSamplesPerPrompt = 4, kSteps = 6;

// One epoch: 96 prompts, 16 per step, 4 samples each, every sample logged; a checkpoint after every step,
// all of them kept (so that the test can read what each resume started from).
std::string partial_run(const std::string& run_dir) {
  return "train algorithm.adv_estimator=grpo " + hybridflow::testing::tiny_rl_model_args() +
         " data.task=addition data.train_size=" + std::to_string(kPrompts) +
         " data.test_size=0 data.train_batch_size=16 actor_rollout_ref.rollout.n=" +
         std::to_string(kSamplesPerPrompt) +
         " actor_rollout_ref.rollout.response_length=96 actor_rollout_ref.rollout.max_num_seqs=1 "
         "actor_rollout_ref.actor.ppo_mini_batch_size=16 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16 "
         "trainer.placement=standalone actor_rollout_ref.rollout.staleness=3 "
         "actor_rollout_ref.rollout.trigger_parameter_sync_step=2 actor_rollout_ref.rollout.partial_rollout=true "
         "trainer.total_steps=" +
         std::to_string(kSteps) +
         " trainer.save_freq=1 trainer.max_ckpt_to_keep=0 trainer.log_samples_freq=1 trainer.log_samples_count=64 "
         "trainer.run_dir=" +
         run_dir;
}

// Tokens a checkpoint holds of responses that were in flight when it was taken (0: none).
int64_t partial_tokens(const std::string& checkpoint) {
  int64_t tokens = 0;
  for (const auto& entry : fs::directory_iterator(checkpoint)) {
    if (entry.path().filename().string().rfind("rollout_partial.bin", 0) != 0) continue;
    const auto request = hybridflow::DataProto::deserialize(hybridflow::read_file(entry.path().string()));
    tokens += request.tensor("partial_lengths").sum().item<int64_t>();
  }
  return tokens;
}

// The checkpoints the runs logged in `output` resumed from.
std::vector<std::string> resumed_from(const std::string& output) {
  static const std::regex line("resumed from checkpoint (\\S+) at step");
  std::vector<std::string> dirs;
  for (auto it = std::sregex_iterator(output.begin(), output.end(), line); it != std::sregex_iterator(); ++it)
    dirs.push_back((*it)[1].str());
  return dirs;
}

bool checkpoint_complete(const std::string& run_dir, int step) {
  return hybridflow::is_complete_checkpoint(hybridflow::checkpoints_root(run_dir) + "/step_" + std::to_string(step));
}

struct KilledRun {
  int kills_landed = 0;
  std::vector<std::string> resumes;  // the checkpoints its runs resumed from, in order
  int64_t resumed_partial_tokens = 0;  // tokens of in-flight responses those checkpoints held
};

// Kills the run right after the checkpoints of steps 1 and 3 are committed (the next rollouts in flight,
// their partial responses in the checkpoint), a few milliseconds after step 4's metrics line
// (mid-checkpoint or mid-step), and right after step 5's checkpoint; then runs it to the end.
KilledRun kill_and_resume(const std::string& run_dir, const std::string& log) {
  KilledRun r;
  const std::string command = std::string(HF_BINARY) + " " + partial_run(run_dir);
  const std::vector<std::pair<std::function<bool()>, int>> moments = {
      {[&] { return checkpoint_complete(run_dir, 1); }, 0},
      {[&] { return checkpoint_complete(run_dir, 3); }, 0},
      {[&] { return lines_in(run_dir + "/metrics.jsonl") >= 4; }, 5},
      {[&] { return checkpoint_complete(run_dir, 5); }, 0},
  };
  for (const auto& [ready, delay_ms] : moments) {
    if (lines_in(run_dir + "/metrics.jsonl") >= kSteps) break;
    r.kills_landed += hybridflow::testing::kill_run_when(command, ready, std::chrono::milliseconds(delay_ms), log);
  }
  const auto last = hybridflow::testing::run_hybridflow(partial_run(run_dir));
  EXPECT_EQ(last.exit_code, 0) << last.output;
  r.resumes = resumed_from(hybridflow::read_file(log) + last.output);
  for (const std::string& checkpoint : r.resumes) r.resumed_partial_tokens += partial_tokens(checkpoint);
  return r;
}

TEST(CliAsyncKillPartial, KillsWithPartialResponsesInFlightLoseAndDuplicateNoPrompt) {
  hybridflow::testing::TempDir dir;
  const std::string straight = dir.file("straight");
  const auto uninterrupted = hybridflow::testing::run_hybridflow(partial_run(straight));
  ASSERT_EQ(uninterrupted.exit_code, 0) << uninterrupted.output;
  const std::map<std::string, int> want = prompt_uses(straight);
  int64_t samples = 0;
  for (const auto& [prompt, uses] : want) samples += uses;
  ASSERT_EQ(samples, int64_t{kPrompts} * kSamplesPerPrompt) << "one epoch: every prompt's samples, once";

  // Whether a checkpoint catches tokens drawn but not finished depends on the clock (the rollout may have
  // finished its batch before the trainer pauses it), so a few killed runs are allowed; each of them must
  // train every prompt exactly once, and one of them must have resumed from partial responses.
  bool caught = false;
  for (int attempt = 0; attempt < 3 && !caught; ++attempt) {
    const std::string killed = dir.file("killed" + std::to_string(attempt));
    const std::string log = dir.file("killed" + std::to_string(attempt) + ".log");
    const KilledRun r = kill_and_resume(killed, log);
    EXPECT_GE(r.kills_landed, 3) << "the kills came after the run had ended:\n" << hybridflow::read_file(log);
    EXPECT_GE(r.resumes.size(), 2u) << hybridflow::read_file(log);

    std::vector<int64_t> steps;
    for (const auto& record : hybridflow::read_jsonl(killed + "/metrics.jsonl")) steps.push_back(record.at("step"));
    EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
    EXPECT_EQ(prompt_uses(killed), want) << "a prompt was lost or trained twice across the kills";
    std::cout << "killed run " << attempt << ": " << r.kills_landed << " kills, " << r.resumes.size()
              << " resumes, from checkpoints holding " << r.resumed_partial_tokens << " tokens of partial responses\n";
    caught = r.resumed_partial_tokens > 0;
  }
  EXPECT_TRUE(caught) << "no resume in 3 killed runs started from a checkpoint holding partial responses";
}

}  // namespace
