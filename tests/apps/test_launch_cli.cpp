// `hybridflow train` started by launchers: a real mpirun whose ranks become the actor and critic
// pools, and a torchrun-style launch with too few ranks for the pools.
#include <gtest/gtest.h>
#include <unistd.h>

#include <sstream>
#include <string>

#include "support/free_tcp_port.h"
#include "support/run_command.h"
#include "support/temp_dir.h"

namespace {

using hybridflow::testing::CommandResult;
using hybridflow::testing::run_shell;

bool on_path(const std::string& program) {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "");
  for (std::string dir; std::getline(dirs, dir, ':');)
    if (!dir.empty() && ::access((dir + "/" + program).c_str(), X_OK) == 0) return true;
  return false;
}

// A tiny PPO run with the actor and the critic in pools of their own: two worker ranks.
std::string train_args(const std::string& run_dir) {
  return std::string(HF_BINARY) +
         " train trainer.placement=split algorithm.adv_estimator=gae trainer.total_steps=2 data.train_size=32 "
         "data.test_size=8 data.train_batch_size=4 actor_rollout_ref.actor.ppo_mini_batch_size=4 "
         "critic.ppo_mini_batch_size=4 trainer.run_dir=" + run_dir;
}

}  // namespace

TEST(LaunchCli, MpirunRanksBecomeTheActorAndCriticPools) {
  if (!on_path("mpirun")) GTEST_SKIP() << "mpirun not found on PATH (OpenMPI is installed by scripts/setup.sh)";
  hybridflow::testing::TempDir dir;
  CommandResult r = run_shell(
      "timeout 120 mpirun --allow-run-as-root --oversubscribe --bind-to none -np 3 "
      "-x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=" + std::to_string(hybridflow::testing::free_tcp_port()) +
      " -x OMP_WAIT_POLICY=passive -x HF_JOB_TOKEN=cli-test-mpirun-8d2f6a1c9e4b7035 " + train_args(dir.file("run")));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resource pool 'actor' <- launcher ranks 1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("resource pool 'critic' <- launcher ranks 2"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("step 2/2"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("critic/vf_loss"), std::string::npos) << r.output;
}

TEST(LaunchCli, TooFewRanksForThePoolsIsAnErrorNamingTheNumbers) {
  hybridflow::testing::TempDir dir;
  const std::string env = "WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" +
                          std::to_string(hybridflow::testing::free_tcp_port()) +
                          " HF_JOB_TOKEN=cli-test-5e0b7a93c4d2f1e86a9b7c04 ";
  // Rank 1 is released when the controller gives up; its exit code is printed for the check below.
  CommandResult r = run_shell(
      "(" + env + "RANK=1 LOCAL_RANK=1 timeout 60 " + train_args(dir.file("run")) +
      "; echo worker-exit=$?) & " + env + "RANK=0 LOCAL_RANK=0 timeout 60 " + train_args(dir.file("run")) +
      "; code=$?; wait; exit $code");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("resource pools actor (1) + critic (1) need 2 worker processes, but the torchrun launch "
                          "has 1 worker ranks left"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("worker-exit=0"), std::string::npos) << r.output;
}
