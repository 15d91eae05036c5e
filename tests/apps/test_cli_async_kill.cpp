// A streaming (staleness 2) `hybridflow train` killed with SIGKILL at several moments - right after a step's
// metrics line, before its checkpoint, and a little later, mid-step or mid-save - and run again each time
// until it finishes: the resumed run trains every prompt of the epoch exactly as often as an uninterrupted
// run, none lost with the rollouts buffered or in flight at a kill, none trained twice. With and without
// partial rollouts.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "hybridflow/core/fs.h"
#include "hybridflow/core/jsonl.h"
#include "support/process_tree.h"
#include "support/run_command.h"
#include "support/temp_dir.h"
#include "support/tiny_rl_config.h"

namespace {

using hybridflow::testing::alive;
using hybridflow::testing::lines_in;
using hybridflow::testing::live_children;

// One epoch: 16 prompts, 2 per step, 2 samples each, every sample logged; a checkpoint after every step.
std::string streaming_run(const std::string& run_dir, bool partial) {
  return "train algorithm.adv_estimator=grpo " + hybridflow::testing::tiny_rl_model_args() +
         " data.task=addition data.train_size=16 data.test_size=0 data.train_batch_size=2 "
         "actor_rollout_ref.rollout.n=2 actor_rollout_ref.rollout.response_length=24 "
         "actor_rollout_ref.actor.ppo_mini_batch_size=2 trainer.placement=standalone "
         "actor_rollout_ref.rollout.staleness=2 actor_rollout_ref.rollout.partial_rollout=" +
         std::string(partial ? "true" : "false") +
         " trainer.total_steps=8 trainer.save_freq=1 trainer.log_samples_freq=1 trainer.log_samples_count=64 "
         "trainer.run_dir=" +
         run_dir;
}

// Starts the run, waits for `after_lines` metrics lines and `delay` more, and kills the controller and its
// workers with SIGKILL (a crash: no checkpoint, no cleanup). True when the kill landed before the run ended.
bool kill_run_at(const std::string& command, const std::string& run_dir, int64_t after_lines,
                 std::chrono::milliseconds delay, const std::string& log) {
  const pid_t pid = ::fork();
  if (pid < 0) return false;
  if (pid == 0) {
    ::execl("/bin/sh", "sh", "-c", ("exec " + command + " >> " + log + " 2>&1").c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(180);
  while (lines_in(run_dir + "/metrics.jsonl") < after_lines && alive(pid) &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::this_thread::sleep_for(delay);
  const std::vector<pid_t> workers = live_children(pid);
  ::kill(pid, SIGKILL);
  for (pid_t w : workers) ::kill(w, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  // The workers are the controller's children, reaped by init: wait until they are gone (they hold nothing
  // the next run needs, but a test should not leave them behind).
  for (pid_t w : workers)
    while (alive(w) && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
  return WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
}

std::map<std::string, int> prompt_uses(const std::string& run_dir) {
  std::map<std::string, int> uses;
  for (const auto& sample : hybridflow::read_jsonl(run_dir + "/samples.jsonl"))
    ++uses[sample.at("prompt").get<std::string>()];
  return uses;
}

void expect_kills_lose_and_duplicate_no_prompt(bool partial) {
  hybridflow::testing::TempDir dir;
  const std::string straight = dir.file("straight"), killed = dir.file("killed"), log = dir.file("killed.log");
  const auto uninterrupted = hybridflow::testing::run_hybridflow(streaming_run(straight, partial));
  ASSERT_EQ(uninterrupted.exit_code, 0) << uninterrupted.output;
  const std::map<std::string, int> want = prompt_uses(straight);
  int64_t samples = 0;
  for (const auto& [prompt, uses] : want) samples += uses;
  ASSERT_EQ(samples, 8 * 2 * 2) << "8 steps of 2 prompts with 2 samples each";

  const std::string command = std::string(HF_BINARY) + " " + streaming_run(killed, partial);
  // (metrics lines, then a delay): right after step 1's line (before its checkpoint), mid-step 4 and later.
  const std::vector<std::pair<int64_t, int>> moments = {{1, 0}, {3, 7}, {5, 19}, {6, 2}};
  int landed = 0;
  for (const auto& [lines, delay_ms] : moments) {
    if (lines_in(killed + "/metrics.jsonl") >= 8) break;
    landed += kill_run_at(command, killed, lines, std::chrono::milliseconds(delay_ms), log);
  }
  EXPECT_GE(landed, 2) << "the kills came after the run had ended:\n" << hybridflow::read_file(log);
  const auto last = hybridflow::testing::run_hybridflow(streaming_run(killed, partial));
  ASSERT_EQ(last.exit_code, 0) << last.output;
  EXPECT_NE(last.output.find("resumed from checkpoint"), std::string::npos) << last.output;

  std::vector<int64_t> steps;
  for (const auto& record : hybridflow::read_jsonl(killed + "/metrics.jsonl")) steps.push_back(record.at("step"));
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(prompt_uses(killed), want) << "a prompt was lost or trained twice across the kills";
}

}  // namespace

TEST(CliAsyncKill, StreamingRunKilledAndResumedTrainsEveryPromptExactlyOnce) {
  expect_kills_lose_and_duplicate_no_prompt(/*partial=*/false);
}

TEST(CliAsyncKill, PartialRolloutRunKilledAndResumedTrainsEveryPromptExactlyOnce) {
  expect_kills_lose_and_duplicate_no_prompt(/*partial=*/true);
}
