// Safe-RLHF in the RL trainer over real worker processes: a frequent rule cost above cost_limit makes the
// Lagrange multiplier rise and the policy's episode cost fall; a cost model and a cost critic start as
// their own worker groups.
#include <gtest/gtest.h>

#include <cstdio>
#include <numeric>

#include "hybridflow/core/config.h"
#include "hybridflow/core/error.h"
#include "hybridflow/runtime/worker_main.h"
#include "hybridflow/trainer/rl_trainer.h"
#include "hybridflow/workers/rl_workers.h"
#include "support/error_of.h"
#include "support/temp_dir.h"

using namespace hybridflow;

static const bool kRanAsWorker = (register_rl_workers(), run_worker_if_requested());

namespace {

std::vector<std::string> tiny_safe_run(const std::string& run_dir, std::vector<std::string> extra) {
  std::vector<std::string> o = {"model.hidden_size=32",
                                "model.num_hidden_layers=1",
                                "model.num_attention_heads=2",
                                "model.num_key_value_heads=1",
                                "model.intermediate_size=64",
                                "data.task=addition",
                                "data.train_size=64",
                                "data.test_size=4",
                                "data.train_batch_size=4",
                                "actor_rollout_ref.rollout.n=4",
                                "actor_rollout_ref.rollout.response_length=6",
                                "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                                "actor_rollout_ref.actor.ppo_micro_batch_size=16",
                                "actor_rollout_ref.actor.optim.lr=3e-3",
                                "critic.ppo_mini_batch_size=4",
                                "critic.ppo_micro_batch_size=16",
                                "critic.optim.lr=3e-3",
                                "reward.type=none",
                                "trainer.run_dir=" + run_dir};
  o.insert(o.end(), extra.begin(), extra.end());
  return o;
}

double mean(const std::vector<double>& v, size_t begin, size_t end) {
  return std::accumulate(v.begin() + static_cast<long>(begin), v.begin() + static_cast<long>(end), 0.0) /
         static_cast<double>(end - begin);
}

}  // namespace

// A response costs 1 when it contains any of the digits 0-5: most random responses of 6 tokens do. With
// no reward, only the cost term moves the policy; it can avoid those digits or stop early.
TEST(SafeRlhf, MultiplierRisesWhileCostExceedsTheLimitAndEpisodeCostFalls) {
  hybridflow::testing::TempDir dir;
  const double limit = 0.2;
  const int steps = 30;
  RLTrainer trainer(load_rl_config(
      "", tiny_safe_run(dir.path(), {"algorithm.adv_estimator=gae", "cost.type=contains",
                                     "cost.contains=['0','1','2','3','4','5']",
                                     "algorithm.safe_rlhf.cost_limit=" + std::to_string(limit),
                                     "algorithm.safe_rlhf.lambda_init=1.0", "algorithm.safe_rlhf.lambda_lr=0.05",
                                     "trainer.total_steps=" + std::to_string(steps)})));
  EXPECT_EQ(trainer.roles(), (std::vector<std::string>{"actor", "critic", "cost_critic"}));
  const double cost_critic_before = trainer.parameter_sq_norm("cost_critic");
  std::vector<double> cost, lambda;
  double previous_lambda = 1.0;
  for (int i = 0; i < steps; ++i) {
    nlohmann::json r = trainer.step();
    for (const char* key : {"cost/mean", "lagrangian/lambda", "cost_critic/vf_loss", "critic/vf_loss"})
      ASSERT_TRUE(r.contains(key)) << key << " missing in " << r.dump();
    cost.push_back(r.at("cost/mean").get<double>());
    lambda.push_back(r.at("lagrangian/lambda").get<double>());
    std::printf("step %2d cost %.3f lambda %.3f cost_vf_loss %.4f\n", i + 1, cost.back(), lambda.back(),
                r.at("cost_critic/vf_loss").get<double>());
    // The multiplier moves with the sign of this step's violation.
    if (cost.back() > limit) {
      EXPECT_GT(lambda.back(), previous_lambda) << "step " << i + 1;
    } else if (cost.back() < limit) {
      EXPECT_LT(lambda.back(), previous_lambda) << "step " << i + 1;
    }
    previous_lambda = lambda.back();
  }
  const double early = mean(cost, 0, 4), late = mean(cost, steps - 4, steps);
  std::printf("episode cost: first 4 steps %.3f, last 4 steps %.3f; lambda %.3f -> %.3f\n", early, late,
              lambda.front(), lambda.back());
  EXPECT_GT(early, 0.6);  // frequent at the start, well above the limit
  EXPECT_LT(late, early - 0.25);
  EXPECT_GT(lambda.back(), 1.0);
  EXPECT_NE(trainer.parameter_sq_norm("cost_critic"), cost_critic_before);  // the cost critic trained
}

TEST(SafeRlhf, CostModelIsItsOwnGroupAndCriticFreeEstimatorsStartNoCostCritic) {
  hybridflow::testing::TempDir dir;
  RLTrainer trainer(load_rl_config(
      "", tiny_safe_run(dir.path(), {"algorithm.adv_estimator=grpo", "cost_model.enable=true", "trainer.total_steps=1"})));
  EXPECT_EQ(trainer.roles(), (std::vector<std::string>{"actor", "cost_model"}));
  nlohmann::json r = trainer.step();
  ASSERT_TRUE(r.contains("cost/mean")) << r.dump();
  // A fresh value head scores sequences with nonzero values: the cost came from the model.
  EXPECT_NE(r.at("cost/mean").get<double>(), 0.0);
  EXPECT_TRUE(r.contains("lagrangian/lambda"));
}

TEST(SafeRlhf, ShippedExampleConfiguresACostAndABoundedMultiplier) {
  const Config c = load_rl_config(std::string(HF_SOURCE_DIR) + "/examples/safe_rlhf_addition.yaml", {});
  EXPECT_EQ(c.get<std::string>("cost.type"), "contains");
  EXPECT_FALSE(c.get<std::vector<std::string>>("cost.contains").empty());
  EXPECT_EQ(c.get<std::string>("algorithm.adv_estimator"), "gae");  // so a cost critic starts
  EXPECT_FALSE(c.is_null("algorithm.safe_rlhf.lambda_max"));
}

TEST(SafeRlhf, NoCostMeansPlainPpoAndABadCostTypeIsNamed) {
  hybridflow::testing::TempDir dir;
  EXPECT_NE(hybridflow::testing::error_of([&] {
              RLTrainer(load_rl_config("", tiny_safe_run(dir.path(), {"cost.type=regex"})));
            }).find("cost.type"),
            std::string::npos);
  RLTrainer trainer(load_rl_config("", tiny_safe_run(dir.path(), {"algorithm.adv_estimator=gae", "trainer.total_steps=1"})));
  EXPECT_EQ(trainer.roles(), (std::vector<std::string>{"actor", "critic"}));
  nlohmann::json r = trainer.step();
  EXPECT_FALSE(r.contains("lagrangian/lambda"));
  EXPECT_FALSE(r.contains("cost/mean"));
}
