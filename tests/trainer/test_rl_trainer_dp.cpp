// The RL trainer with data-parallel worker groups (num_processes = 2): GRPO with a 2-process actor, PPO
// with a 2-process actor and critic in separate pools and colocated, run their steps, and the update
// metrics report the gradient all-reduce; balance_batch evens the ranks' tokens in the updates and log-prob passes.
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

// trainer.balance_batch (verl's default): the actor's update rows, and those of its log-prob passes, are reordered
// so that the two ranks get like token counts (verl's global_seqlen/* metrics say how like), and the passes'
// results come back in the batch's order; one mini-batch's gradient is a sum over every row whichever rank holds
// it, so the trained model is the unbalanced run's up to rounding. A log-prob put back on another row would show
// as a ratio away from 1 before the first optimizer step (actor/ppo_kl), a reference log-prob as a KL to the
// reference, which is the actor before its first step (actor/kl_loss).
TEST(RlTrainerDataParallel, BalanceBatchEvensTheRanksTokensAndTrainsTheSameModel) {
  double initial_norm = 0;
  auto run = [&initial_norm](bool balance) {
    // A reward that differs between samples, so that the update moves the model.
    RLTrainer trainer(load_rl_config(
        "", tiny_dp_run("grpo", {"data.train_batch_size=4", "actor_rollout_ref.rollout.response_length=8",
                                 "actor_rollout_ref.actor.ppo_mini_batch_size=4", "trainer.total_steps=1",
                                 "actor_rollout_ref.actor.use_kl_loss=true", "reward.type=command",
                                 "reward.shell=/usr/bin/python3 -c \"import sys,json\nfor l in sys.stdin: "
                                 "print(len(json.loads(l)['response']) % 3 / 2.0, flush=True)\"",
                                 std::string("trainer.balance_batch=") + (balance ? "true" : "false")})));
    initial_norm = trainer.parameter_sq_norm("actor");
    nlohmann::json record = trainer.step();
    return std::pair{record, trainer.parameter_sq_norm("actor")};
  };
  const auto [balanced, balanced_norm] = run(true);
  const auto [in_order, in_order_norm] = run(false);
  ASSERT_NE(in_order_norm, initial_norm) << "the update moved the model";
  ASSERT_NE(in_order.at("actor/pg_loss").get<double>(), 0.0) << in_order.dump();
  for (const char* key : {"global_seqlen/min", "global_seqlen/max", "global_seqlen/balanced_min",
                          "global_seqlen/balanced_max", "global_seqlen/mean", "global_seqlen/minmax_diff"})
    ASSERT_TRUE(balanced.contains(key)) << key << " in " << balanced.dump();
  EXPECT_FALSE(in_order.contains("global_seqlen/mean")) << in_order.dump();
  const double diff = balanced.at("global_seqlen/minmax_diff").get<double>();
  const double balanced_diff =
      balanced.at("global_seqlen/balanced_max").get<double>() - balanced.at("global_seqlen/balanced_min").get<double>();
  EXPECT_LE(balanced_diff, diff) << balanced.dump();
  EXPECT_DOUBLE_EQ(balanced.at("global_seqlen/min").get<double>() + balanced.at("global_seqlen/max").get<double>(),
                   2 * balanced.at("global_seqlen/mean").get<double>());
  // The same rollouts (same seeds) and the same update up to float rounding.
  EXPECT_EQ(balanced.at("response_length/mean"), in_order.at("response_length/mean"));
  EXPECT_NEAR(balanced_norm, in_order_norm, 1e-6 * in_order_norm);
  EXPECT_NEAR(balanced.at("actor/pg_loss").get<double>(), in_order.at("actor/pg_loss").get<double>(), 1e-6);
  for (const auto* record : {&balanced, &in_order}) {
    EXPECT_NEAR(record->at("actor/ppo_kl").get<double>(), 0.0, 1e-6) << record->dump();
    EXPECT_NEAR(record->at("actor/kl_loss").get<double>(), 0.0, 1e-6) << record->dump();  // the reference's
    EXPECT_NEAR(record->at("actor/pg_clipfrac").get<double>(), 0.0, 1e-12) << record->dump();
  }
}
