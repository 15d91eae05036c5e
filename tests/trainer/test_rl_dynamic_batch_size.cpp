// The training and inference passes of a whole RL step, switched between their forms that must not change
// the result: verl's dynamic batch size and activation checkpointing on every role (a PPO step with a critic,
// KL loss and KL in the reward) against padded micro-batches of rows without checkpointing; and verl's bypass
// mode (the rollout's log-probs as the old ones, no old-log-prob pass) against the recomputed old log-probs.
#include <gtest/gtest.h>

#include <cmath>

#include "hybridflow/runtime/worker_main.h"
#include "hybridflow/trainer/rl_trainer.h"
#include "hybridflow/workers/rl_workers.h"
#include "support/error_of.h"
#include "support/tiny_rl_config.h"

using namespace hybridflow;
using hybridflow::testing::tiny_rl_overrides;

static const bool kRanAsWorker = (register_rl_workers(), run_worker_if_requested());

namespace {

std::vector<std::string> ppo_step(std::vector<std::string> extra) {
  std::vector<std::string> base = {"actor_rollout_ref.rollout.response_length=8", "actor_rollout_ref.actor.use_kl_loss=true",
                                   "algorithm.use_kl_in_reward=true",           "data.train_batch_size=4",
                                   "actor_rollout_ref.actor.ppo_mini_batch_size=2", "critic.ppo_mini_batch_size=2",
                                   "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
                                   "critic.ppo_micro_batch_size_per_gpu=2",
                                   "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm",
                                   "trainer.total_steps=1"};
  base.insert(base.end(), extra.begin(), extra.end());
  return tiny_rl_overrides("gae", base);
}

TEST(RlDynamicBatchSize, AStepByTokenCountWithCheckpointingEqualsThePaddedStep) {
  RLTrainer padded(load_rl_config("", ppo_step({})));
  const nlohmann::json want = padded.step();
  // Budgets of about one or two rows: every pass splits differently from the padded one.
  RLTrainer dynamic(load_rl_config(
      "", ppo_step({"actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=24",
                    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=40", "critic.ppo_max_token_len_per_gpu=30",
                    "actor_rollout_ref.model.enable_gradient_checkpointing=true",
                    "critic.model.enable_gradient_checkpointing=true"})));
  const nlohmann::json got = dynamic.step();
  // The rollout and everything computed from whole-batch tensors: the same.
  for (const char* key : {"score/mean", "response_length/mean", "values/mean", "actor/ref_kl", "advantages/mean",
                          "returns/mean"}) {
    ASSERT_TRUE(want.contains(key) && got.contains(key)) << key << " in " << want.dump();
    EXPECT_NEAR(got.at(key).get<double>(), want.at(key).get<double>(), 1e-5) << key;
  }
  for (const char* role : {"actor", "critic"}) {
    const double a = padded.parameter_sq_norm(role), b = dynamic.parameter_sq_norm(role);
    EXPECT_LT(std::abs(a - b), 1e-6 * a) << role << ": " << a << " vs " << b;
  }
}

TEST(RlBypassMode, TheRolloutsLogProbsServeAsTheOldOnesForTheSameStep) {
  const std::vector<std::string> grpo = tiny_rl_overrides("grpo", {"trainer.total_steps=1", "data.train_batch_size=4",
                                                                   "actor_rollout_ref.rollout.response_length=8"});
  RLTrainer recomputed(load_rl_config("", grpo));
  const nlohmann::json want = recomputed.step();
  std::vector<std::string> bypass = grpo;
  bypass.push_back("algorithm.rollout_correction.bypass_mode=true");
  RLTrainer bypassed(load_rl_config("", bypass));
  const nlohmann::json got = bypassed.step();
  EXPECT_TRUE(want.contains("timing/old_log_prob_s")) << want.dump();
  EXPECT_FALSE(got.contains("timing/old_log_prob_s")) << "the old-log-prob pass must not run: " << got.dump();
  EXPECT_NEAR(got.at("score/mean").get<double>(), want.at("score/mean").get<double>(), 1e-12);
  // The rollout's log-probs are the actor's own, up to float rounding: the ratio stays 1.
  EXPECT_NEAR(got.at("actor/ppo_kl").get<double>(), 0.0, 1e-5);
  const double a = recomputed.parameter_sq_norm("actor"), b = bypassed.parameter_sq_norm("actor");
  EXPECT_LT(std::abs(a - b), 1e-6 * a) << a << " vs " << b;
  // verl's bypass mode trains with PPO's clipped loss only.
  bypass.push_back("actor_rollout_ref.actor.policy_loss.loss_mode=gspo");
  const std::string message = hybridflow::testing::error_of([&] { RLTrainer t(load_rl_config("", bypass)); });
  EXPECT_NE(message.find("bypass_mode"), std::string::npos) << message;
}

TEST(RlDynamicBatchSize, AnEnabledBudgetMustBePositive) {
  const std::string message = hybridflow::testing::error_of([] {
    RLTrainer t(load_rl_config("", ppo_step({"critic.use_dynamic_bsz=true", "critic.ppo_max_token_len_per_gpu=0"})));
  });
  EXPECT_NE(message.find("critic.ppo_max_token_len_per_gpu"), std::string::npos) << message;
}

}  // namespace
