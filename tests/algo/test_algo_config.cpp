#include <gtest/gtest.h>

#include "hybridflow/algo/algo_config.h"
#include "hybridflow/core/error.h"

namespace hybridflow::algo {
namespace {

TEST(AlgoConfig, DefaultsMatchVerl) {
  auto cfg = Config::load_from_string(kAlgoDefaultsYaml, "", "test", {});
  auto params = advantage_params(cfg.subtree("algorithm"));
  EXPECT_EQ(params.gamma, 1.0);
  EXPECT_TRUE(params.norm_adv_by_std_in_grpo);
  EXPECT_EQ(advantage_estimator_name(cfg.subtree("algorithm")), "gae");
  auto kl = kl_controller(cfg.subtree("algorithm"));
  EXPECT_FALSE(kl.is_adaptive());
  EXPECT_DOUBLE_EQ(kl.value(), 0.001);
  auto loss = policy_loss_config(cfg.subtree("actor"));
  EXPECT_FALSE(loss.clip_ratio_low.has_value());
  EXPECT_EQ(loss.agg_mode, LossAggMode::kTokenMean);
  EXPECT_EQ(actor_loss_terms(cfg.subtree("actor")).kl_loss_type, KlType::kK3);
  EXPECT_FALSE(lagrange_config(cfg.subtree("algorithm")).lambda_max.has_value());
}

TEST(AlgoConfig, OverridesReachTheStructs) {
  auto cfg = Config::load_from_string(
      kAlgoDefaultsYaml, "algorithm:\n  adv_estimator: grpo\n  kl_ctrl:\n    type: adaptive\n", "user.yaml",
      {"actor.clip_ratio_high=0.28", "actor.loss_agg_mode=seq-mean-token-mean", "algorithm.lam=0.95",
       "algorithm.safe_rlhf.lambda_max=2.5", "actor.kl_loss_type=k2", "algorithm.kl_penalty=abs"});
  auto algorithm = cfg.subtree("algorithm");
  EXPECT_EQ(advantage_estimator_name(algorithm), "grpo");
  EXPECT_DOUBLE_EQ(advantage_params(algorithm).lam, 0.95);
  EXPECT_TRUE(kl_controller(algorithm).is_adaptive());
  EXPECT_EQ(reward_kl_type(algorithm), KlType::kAbs);
  EXPECT_DOUBLE_EQ(lagrange_config(algorithm).lambda_max.value(), 2.5);
  auto loss = policy_loss_config(cfg.subtree("actor"));
  EXPECT_DOUBLE_EQ(loss.clip_ratio_high.value(), 0.28);
  EXPECT_EQ(loss.agg_mode, LossAggMode::kSeqMeanTokenMean);
  EXPECT_EQ(actor_loss_terms(cfg.subtree("actor")).kl_loss_type, KlType::kK2);
}

TEST(AlgoConfig, MissingKeysFallBackAndBadNamesFail) {
  auto bare = Config::load_from_string("algorithm:\n  gamma: 0.9\n", "", "test", {});
  EXPECT_DOUBLE_EQ(advantage_params(bare.subtree("algorithm")).gamma, 0.9);
  EXPECT_DOUBLE_EQ(advantage_params(bare.subtree("algorithm")).lam, 1.0);
  auto bad = Config::load_from_string(kAlgoDefaultsYaml, "", "test", {"algorithm.adv_estimator=ppo2"});
  EXPECT_THROW(advantage_estimator_name(bad.subtree("algorithm")), Error);
}

}  // namespace
}  // namespace hybridflow::algo
