// The RL trainer with data-parallel worker groups (num_processes = 2): GRPO with a 2-process actor, PPO
// with a 2-process actor and critic in separate pools and colocated, run their steps, and the update
// metrics report the gradient all-reduce.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "hybridflow/runtime/worker_main.h"
#include "hybridflow/trainer/rl_trainer.h"
#include "hybridflow/workers/rl_workers.h"
#include "support/tiny_rl_config.h"

using namespace hybridflow;

static const bool kRanAsWorker = (register_rl_workers(), run_worker_if_requested());

namespace {

// The tiny run with the actor (and the critic, where started) in pools of 2 processes of their own.
std::vector<std::string> tiny_dp_run(const std::string& estimator, std::vector<std::string> extra) {
  std::vector<std::string> o = {"actor_rollout_ref.num_processes=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
                                "critic.ppo_micro_batch_size_per_gpu=1", "trainer.placement=split"};
  o.insert(o.end(), extra.begin(), extra.end());
  return hybridflow::testing::tiny_rl_overrides(estimator, o);
}

// The step's update all-reduced gradients (the volume is asserted exactly in test_rl_workers_dp).
void expect_all_reduced(const nlohmann::json& record, const std::string& prefix) {
  ASSERT_TRUE(record.contains(prefix + "dp_allreduce_bytes")) << record.dump();
  EXPECT_GT(record.at(prefix + "dp_allreduce_bytes").get<double>(), 0.0);
  EXPECT_TRUE(std::isfinite(record.at(prefix + "loss").get<double>())) << record.dump();
}

}  // namespace

TEST(RlTrainerDataParallel, GrpoWithATwoProcessActor) {
  RLTrainer trainer(load_rl_config("", tiny_dp_run("grpo", {})));
  const double before = trainer.parameter_sq_norm("actor");
  nlohmann::json first = trainer.step();
  nlohmann::json second = trainer.step();
  EXPECT_EQ(trainer.steps_done(), 2);
  EXPECT_NE(trainer.parameter_sq_norm("actor"), before);
  expect_all_reduced(first, "actor/");
  // Each step all-reduces the same buffer the same number of times.
  EXPECT_EQ(first.at("actor/dp_allreduce_bytes"), second.at("actor/dp_allreduce_bytes"));
  EXPECT_TRUE(second.contains("actor/pg_loss")) << second.dump();
}

TEST(RlTrainerDataParallel, PpoWithATwoProcessCritic) {
  RLTrainer trainer(load_rl_config("", tiny_dp_run("gae", {"critic.num_processes=2"})));
  EXPECT_EQ(trainer.roles(), (std::vector<std::string>{"actor", "critic"}));
  const double critic_before = trainer.parameter_sq_norm("critic");
  trainer.step();
  nlohmann::json record = trainer.step();
  EXPECT_EQ(trainer.steps_done(), 2);
  EXPECT_NE(trainer.parameter_sq_norm("critic"), critic_before);
  expect_all_reduced(record, "critic/");
  expect_all_reduced(record, "actor/");
  EXPECT_TRUE(record.contains("critic/vf_loss")) << record.dump();
}

// Colocated: actor and critic share the same 2 processes, each role with its own process group.
TEST(RlTrainerDataParallel, PpoWithActorAndCriticColocatedOnTwoProcesses) {
  RLTrainer trainer(load_rl_config("", tiny_dp_run("gae", {"trainer.placement=colocate"})));
  const double actor_before = trainer.parameter_sq_norm("actor");
  const double critic_before = trainer.parameter_sq_norm("critic");
  nlohmann::json record = trainer.step();
  EXPECT_NE(trainer.parameter_sq_norm("actor"), actor_before);
  EXPECT_NE(trainer.parameter_sq_norm("critic"), critic_before);
  expect_all_reduced(record, "critic/");
  expect_all_reduced(record, "actor/");
}
