// A whole RL step (PPO with a critic, KL loss and KL in the reward) with verl's dynamic batch size and
// activation checkpointing on every role equals the step with padded micro-batches of rows and no
// checkpointing: same rollout, same batch-level figures, same actor and critic after the update.
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

TEST(RlDynamicBatchSize, AnEnabledBudgetMustBePositive) {
  const std::string message = hybridflow::testing::error_of([] {
    RLTrainer t(load_rl_config("", ppo_step({"critic.use_dynamic_bsz=true", "critic.ppo_max_token_len_per_gpu=0"})));
  });
  EXPECT_NE(message.find("critic.ppo_max_token_len_per_gpu"), std::string::npos) << message;
}

}  // namespace
