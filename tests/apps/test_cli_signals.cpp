// Ctrl-C / SIGTERM during `hybridflow train`: the run stops after the current step, writes its checkpoint,
// ends every worker, says how to resume, and exits 130 / 143 as a shell expects; the printed command then
// continues from that step.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
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

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Many steps, so that the signal always arrives mid-run; a checkpoint is configured (save_freq) but only
// the stop writes one (the first periodic save would be at step 1000).
std::string tiny_run(const std::string& run_dir) {
  return "train algorithm.adv_estimator=grpo " + hybridflow::testing::tiny_rl_model_args() + " data.task=addition "
         "data.train_size=16 data.test_size=0 data.train_batch_size=2 actor_rollout_ref.rollout.n=2 "
         "actor_rollout_ref.rollout.response_length=4 actor_rollout_ref.actor.ppo_mini_batch_size=2 "
         "trainer.total_steps=100000 trainer.save_freq=100000 trainer.run_dir=" +
         run_dir;
}

}  // namespace

TEST(CliSignals, SigtermStopsAfterTheStepCheckpointsEndsWorkersAndTheRunResumesThere) {
  hybridflow::testing::TempDir dir;
  const std::string run = dir.file("run"), log = dir.file("train.log");
  const std::string command = std::string(HF_BINARY) + " " + tiny_run(run);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {  // `exec` keeps the pid: the signal goes to hybridflow itself
    ::execl("/bin/sh", "sh", "-c", ("exec " + command + " > " + log + " 2>&1").c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  // The first step's metrics line; generous, it only bounds a broken run.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (lines_in(run + "/metrics.jsonl") < 1 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const std::vector<pid_t> workers = live_children(pid);
  EXPECT_FALSE(workers.empty()) << "the actor's worker process should be running";
  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  const std::string output = hybridflow::read_file(log);
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0) << "\n" << output;
  EXPECT_EQ(WEXITSTATUS(status), 143) << output;

  const int64_t steps = lines_in(run + "/metrics.jsonl");
  ASSERT_GE(steps, 1);
  const std::string ckpt = run + "/checkpoints/step_" + std::to_string(steps);
  EXPECT_TRUE(std::filesystem::exists(ckpt + "/COMPLETE")) << output;
  EXPECT_TRUE(contains(output, "stopped by SIGTERM after step " + std::to_string(steps) + " of 100000")) << output;
  EXPECT_TRUE(contains(output, "checkpoint: " + ckpt)) << output;
  for (pid_t w : workers) EXPECT_FALSE(alive(w)) << "worker " << w << " outlived the run";

  const size_t at = output.find("resume with: ");
  ASSERT_NE(at, std::string::npos) << output;
  const std::string resume = output.substr(at + 13, output.find('\n', at) - at - 13);
  EXPECT_TRUE(contains(resume, tiny_run(run))) << resume;
  // The printed command, one step further (a later override wins).
  const auto again = hybridflow::testing::run_shell(resume + " trainer.total_steps=" + std::to_string(steps + 1));
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_TRUE(contains(again.output, "resumed from checkpoint " + ckpt + " at step " + std::to_string(steps)))
      << again.output;
  std::vector<int64_t> logged;
  for (const auto& record : hybridflow::read_jsonl(run + "/metrics.jsonl")) logged.push_back(record.at("step"));
  ASSERT_EQ(static_cast<int64_t>(logged.size()), steps + 1);
  EXPECT_EQ(logged.back(), steps + 1);
}

// Ctrl-C during a fine-tuning command (`hybridflow rm` here; sft and dpo share the runner): it stops after the
// step, writes checkpoint-<step>, says so and exits 130; the same command continues from that step, and its
// metrics hold every step once.
TEST(CliSignals, SigintStopsAFineTuningRunWithACheckpointAndTheSameCommandResumesIt) {
  hybridflow::testing::TempDir dir;
  const std::string out = dir.file("rm"), log = dir.file("rm.log");
  const std::string args = "rm trainer.eval_every=0 trainer.threads=1 model.hidden_size=32 model.num_hidden_layers=1 "
                           "model.intermediate_size=64 data.train_size=64 data.test_size=8 trainer.batch_size=8 "
                           "trainer.micro_batch_size=8 trainer.out_dir=" + out;
  const std::string command = std::string(HF_BINARY) + " " + args + " trainer.steps=100000";
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::execl("/bin/sh", "sh", "-c", ("exec " + command + " > " + log + " 2>&1").c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (lines_in(out + "/rm_metrics.jsonl") < 1 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_EQ(::kill(pid, SIGINT), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  const std::string output = hybridflow::read_file(log);
  ASSERT_TRUE(WIFEXITED(status)) << output;
  EXPECT_EQ(WEXITSTATUS(status), 130) << output;
  const int64_t steps = lines_in(out + "/rm_metrics.jsonl");
  ASSERT_GE(steps, 1);
  const std::string ckpt = out + "/checkpoint-" + std::to_string(steps);
  EXPECT_TRUE(std::filesystem::exists(ckpt + "/optimizer.pt")) << output;
  EXPECT_TRUE(contains(output, "rm: stopped by SIGINT; checkpoint: " + ckpt)) << output;
  EXPECT_FALSE(std::filesystem::exists(out + "/final")) << "a stopped run saved a final model";

  const auto again = hybridflow::testing::run_shell(std::string(HF_BINARY) + " " + args +
                                                   " trainer.steps=" + std::to_string(steps + 2));
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_TRUE(contains(again.output, "rm summary: " + std::to_string(steps + 2) + " steps (resumed at step " +
                                         std::to_string(steps) + ")"))
      << again.output;
  std::vector<int64_t> logged;
  for (const auto& record : hybridflow::read_jsonl(out + "/rm_metrics.jsonl")) logged.push_back(record.at("step"));
  ASSERT_EQ(static_cast<int64_t>(logged.size()), steps + 2);
  for (int64_t i = 0; i < steps + 2; ++i) EXPECT_EQ(logged[static_cast<size_t>(i)], i + 1);
  EXPECT_TRUE(std::filesystem::exists(out + "/final/config.json"));
}
