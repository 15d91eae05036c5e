// A standalone rollout pool whose worker is killed with SIGKILL in the middle of a run
// (trainer.max_rollout_restarts): the pool is restarted, re-synced, the lost rollouts generated again, and the
// run ends as an uninterrupted one would, every prompt trained exactly once. Past the limit, and for a dead
// trainer rank, the run stops with an error naming what died.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <map>
#include <sstream>
#include <thread>

#include "hybridflow/core/fs.h"
#include "hybridflow/core/jsonl.h"
#include "hybridflow/runtime/worker_main.h"
#include "hybridflow/trainer/checkpoint.h"
#include "hybridflow/trainer/rl_trainer.h"
#include "hybridflow/workers/rl_workers.h"
#include "support/deterministic_metrics.h"
#include "support/error_of.h"
#include "support/temp_dir.h"
#include "support/tiny_rl_config.h"

using namespace hybridflow;
namespace fs = std::filesystem;

static const bool kRanAsWorker = (register_rl_workers(), run_worker_if_requested());

namespace {

using hybridflow::testing::error_of;

// The pid of this process's worker serving `pool` rank `rank`, found by the name it runs under
// ("<binary> worker <pool> rank <rank>"); -1 if there is none.
int worker_pid(const std::string& pool, int rank = 0) {
  const std::string suffix = " worker " + pool + " rank " + std::to_string(rank);
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(entry.path() / "stat");
    std::string line;
    if (!std::getline(stat, line)) continue;
    // pid (comm) state ppid ...: comm may hold spaces, so read after its closing parenthesis.
    std::istringstream rest(line.substr(line.rfind(')') + 1));
    std::string state;
    int ppid = -1;
    rest >> state >> ppid;
    if (ppid != ::getpid()) continue;
    std::ifstream cmdline(entry.path() / "cmdline");
    std::string arg0;
    std::getline(cmdline, arg0, '\0');
    if (arg0.size() >= suffix.size() && arg0.compare(arg0.size() - suffix.size(), suffix.size(), suffix) == 0)
      return std::stoi(name);
  }
  return -1;
}

int kill_worker(const std::string& pool, int rank = 0) {
  const int pid = worker_pid(pool, rank);
  EXPECT_GT(pid, 0) << "no worker of pool '" << pool << "' among this process's children";
  if (pid > 0) ::kill(pid, SIGKILL);
  return pid;
}

// GRPO on the tiny model with a standalone rollout pool, every sample logged (samples.jsonl) so that each
// prompt's uses can be counted: 4 steps of 2 prompts, 2 samples each.
std::vector<std::string> restartable_run(const std::string& run_dir, std::vector<std::string> extra) {
  std::vector<std::string> o = {"trainer.placement=standalone", "trainer.total_steps=4", "trainer.run_dir=" + run_dir,
                                "trainer.log_samples_freq=1", "trainer.log_samples_count=64",
                                "trainer.max_rollout_restarts=1"};
  o.insert(o.end(), extra.begin(), extra.end());
  return hybridflow::testing::tiny_rl_overrides("grpo", o);
}

// The metrics that must not differ between an interrupted and an uninterrupted run: all but wall-clock
// figures, memory, transport bytes and the restart count itself.
nlohmann::json deterministic_part(const nlohmann::json& record) {
  return hybridflow::testing::deterministic_metrics(record, {"rollout/restarts"});
}

struct RunEnd {
  std::vector<nlohmann::json> metrics;  // metrics.jsonl, whole records
  std::vector<double> sq_norms;         // actor and rollout
  std::map<std::string, int> prompt_uses;
};

RunEnd run_end(RLTrainer& trainer, const std::string& run_dir) {
  RunEnd end;
  end.metrics = read_jsonl(run_dir + "/metrics.jsonl");
  for (const char* role : {"actor", "rollout"}) end.sq_norms.push_back(trainer.parameter_sq_norm(role));
  for (const auto& sample : read_jsonl(run_dir + "/samples.jsonl")) ++end.prompt_uses[sample.at("prompt").get<std::string>()];
  return end;
}

void expect_every_prompt_trained_once(const RunEnd& end) {
  EXPECT_EQ(end.prompt_uses.size(), 8u);  // 4 steps of 2 distinct prompts
  for (const auto& [prompt, uses] : end.prompt_uses) EXPECT_EQ(uses, 2) << prompt;  // rollout.n samples each
}

}  // namespace

TEST(RolloutRestarts, ARolloutWorkerKilledMidGenerationIsRestartedAndTheRunMatchesAnUninterruptedOne) {
  hybridflow::testing::TempDir straight_dir, killed_dir;
  RunEnd straight;
  {
    RLTrainer trainer(load_rl_config("", restartable_run(straight_dir.path(), {})));
    trainer.fit();
    straight = run_end(trainer, straight_dir.path());
  }
  RunEnd killed;
  {
    RLTrainer trainer(load_rl_config("", restartable_run(killed_dir.path(), {})));
    trainer.step();
    trainer.step();
    // Step 3's generation reaches a stopped worker, which is then killed: it dies with the call pending.
    const int pid = worker_pid("rollout");
    ASSERT_GT(pid, 0);
    ::kill(pid, SIGSTOP);
    auto step3 = std::async(std::launch::async, [&] { return trainer.step(); });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    ::kill(pid, SIGKILL);
    const nlohmann::json record = step3.get();
    EXPECT_EQ(record.at("rollout/restarts").get<double>(), 1.0) << record.dump();
    const int restarted = worker_pid("rollout");
    EXPECT_GT(restarted, 0);
    EXPECT_NE(restarted, pid);
    trainer.step();
    EXPECT_EQ(trainer.steps_done(), 4);
    killed = run_end(trainer, killed_dir.path());
  }
  ASSERT_EQ(straight.metrics.size(), 4u);
  ASSERT_EQ(killed.metrics.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    // On-policy, the lost prompts are generated again with the same weights and seeds: nothing differs.
    EXPECT_EQ(deterministic_part(killed.metrics[i]), deterministic_part(straight.metrics[i])) << "step " << i + 1;
    EXPECT_EQ(straight.metrics[i].at("rollout/restarts").get<double>(), 0.0);
    EXPECT_EQ(killed.metrics[i].at("rollout/restarts").get<double>(), i < 2 ? 0.0 : 1.0) << "step " << i + 1;
  }
  EXPECT_EQ(killed.sq_norms, straight.sq_norms);
  EXPECT_EQ(killed.prompt_uses, straight.prompt_uses);
  expect_every_prompt_trained_once(killed);
}

namespace {

// Staleness 2: the rollout worker is killed after step 1 (`after_step_1` checks that step's record first),
// the run goes on to its end: one restart, every sample within the bound (also the regenerated ones), and
// every prompt trained exactly once.
void expect_a_killed_staleness_2_pool_loses_no_prompt(
    const std::vector<std::string>& extra, const std::function<void(const nlohmann::json&)>& after_step_1) {
  hybridflow::testing::TempDir dir;
  std::vector<std::string> options = {"actor_rollout_ref.rollout.staleness=2"};
  options.insert(options.end(), extra.begin(), extra.end());
  RLTrainer trainer(load_rl_config("", restartable_run(dir.path(), options)));
  after_step_1(trainer.step());
  kill_worker("rollout");
  trainer.fit();
  EXPECT_EQ(trainer.steps_done(), 4);
  const RunEnd end = run_end(trainer, dir.path());
  ASSERT_EQ(end.metrics.size(), 4u);
  EXPECT_EQ(end.metrics.back().at("rollout/restarts").get<double>(), 1.0);
  for (const auto& record : end.metrics) EXPECT_LE(record.at("rollout/staleness_max").get<double>(), 2.0) << record.dump();
  expect_every_prompt_trained_once(end);
}

}  // namespace

TEST(RolloutRestarts, StreamingRolloutsLoseAndDuplicateNoPromptWhenTheRolloutPoolDies) {
  // After step 1 the pool holds or generates the rollouts of steps 2 and 3; they die with it.
  expect_a_killed_staleness_2_pool_loses_no_prompt({}, [](const nlohmann::json&) {});
}

TEST(RolloutRestarts, StreamedGroupsLoseAndDuplicateNoPromptWhenTheRolloutPoolDies) {
  // With streamed groups, after step 1 the pool carries groups it began and did not return, which die with it;
  // the requests sent again list every prompt no reply returned, and those start again.
  expect_a_killed_staleness_2_pool_loses_no_prompt(
      {"actor_rollout_ref.rollout.stream_groups=true"}, [](const nlohmann::json& first) {
        EXPECT_GT(first.at("rollout/stream_groups_carried").get<double>(), 0) << "step 1 left no begun group to lose";
      });
}

TEST(RolloutRestarts, OneDeadRankRestartsEveryRankOfATwoProcessRolloutPool) {
  // Two generation replicas: rank 1 dies, rank 0 is killed with it, and both come back with their shards.
  hybridflow::testing::TempDir dir;
  RLTrainer trainer(load_rl_config("", restartable_run(dir.path(), {"actor_rollout_ref.rollout.num_processes=2"})));
  trainer.step();
  const int rank0 = worker_pid("rollout", 0);
  kill_worker("rollout", 1);
  trainer.fit();
  EXPECT_EQ(trainer.steps_done(), 4);
  for (int rank : {0, 1}) EXPECT_GT(worker_pid("rollout", rank), 0) << rank;
  EXPECT_NE(worker_pid("rollout", 0), rank0);
  const RunEnd end = run_end(trainer, dir.path());
  ASSERT_EQ(end.metrics.size(), 4u);
  EXPECT_EQ(end.metrics.back().at("rollout/restarts").get<double>(), 1.0);
  expect_every_prompt_trained_once(end);
}

TEST(RolloutRestarts, PastTheLimitTheNextDeathStopsTheRunNamingTheKey) {
  {
    SCOPED_TRACE("trainer.max_rollout_restarts 0: today's stop, with the key named");
    hybridflow::testing::TempDir dir;
    RLTrainer trainer(load_rl_config("", restartable_run(dir.path(), {"trainer.max_rollout_restarts=0"})));
    trainer.step();
    const int pid = kill_worker("rollout");
    const std::string message = error_of([&] { trainer.step(); });
    for (const std::string& part : {std::string("resource pool 'rollout'"), "pid " + std::to_string(pid),
                                    std::string("killed by signal 9"), std::string("trainer.max_rollout_restarts is 0")})
      EXPECT_NE(message.find(part), std::string::npos) << part << " missing in: " << message;
  }
  {
    SCOPED_TRACE("trainer.max_rollout_restarts 1: the second death stops the run");
    hybridflow::testing::TempDir dir;
    RLTrainer trainer(load_rl_config("", restartable_run(dir.path(), {})));
    trainer.step();
    kill_worker("rollout");
    EXPECT_EQ(trainer.step().at("rollout/restarts").get<double>(), 1.0);
    kill_worker("rollout");
    const std::string message = error_of([&] { trainer.step(); });
    for (const char* part : {"resource pool 'rollout'", "killed by signal 9", "trainer.max_rollout_restarts = 1"})
      EXPECT_NE(message.find(part), std::string::npos) << part << " missing in: " << message;
  }
}

TEST(RolloutRestarts, ADeadTrainerRankStillStopsTheRunAndItsCheckpointStays) {
  hybridflow::testing::TempDir dir;
  RLTrainer trainer(load_rl_config("", restartable_run(dir.path(), {"trainer.save_freq=1"})));
  trainer.step();
  trainer.step();
  const int pid = kill_worker("train");
  const std::string message = error_of([&] { trainer.step(); });
  for (const std::string& part : {std::string("resource pool 'train'"), "pid " + std::to_string(pid),
                                  std::string("killed by signal 9")})
    EXPECT_NE(message.find(part), std::string::npos) << part << " missing in: " << message;
  EXPECT_EQ(message.find("restarting"), std::string::npos) << message;
  const std::string root = checkpoints_root(dir.path());
  EXPECT_EQ(read_file(root + "/latest"), "step_2\n");
  EXPECT_TRUE(is_complete_checkpoint(root + "/step_2"));
}

TEST(RolloutRestarts, TheKeyNeedsARolloutPoolOfItsOwn) {
  const std::string colocated = error_of([] {
    RLTrainer trainer(load_rl_config("", hybridflow::testing::tiny_rl_overrides("grpo", {"trainer.max_rollout_restarts=2"})));
  });
  for (const char* part : {"trainer.max_rollout_restarts", "standalone"})
    EXPECT_NE(colocated.find(part), std::string::npos) << part << " missing in: " << colocated;
  const std::string shared = error_of([] {
    RLTrainer trainer(load_rl_config(
        "", hybridflow::testing::tiny_rl_overrides(
                "gae", {"trainer.max_rollout_restarts=1", "pools.learner.processes=1", "pools.learner.roles=[actor]",
                        "pools.gen.processes=1", "pools.gen.roles=[rollout, critic]"})));
  });
  for (const char* part : {"trainer.max_rollout_restarts", "pool 'gen'", "other roles"})
    EXPECT_NE(shared.find(part), std::string::npos) << part << " missing in: " << shared;
  const std::string negative = error_of([] {
    RLTrainer trainer(load_rl_config("", hybridflow::testing::tiny_rl_overrides("grpo", {"trainer.max_rollout_restarts=-1"})));
  });
  EXPECT_NE(negative.find("trainer.max_rollout_restarts must be >= 0"), std::string::npos) << negative;
}
