#include <gtest/gtest.h>

#include <string>
#include <vector>

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

TEST(AlgoConfig, LossScaleFactorAndPolicyLossMode) {
  auto defaults = policy_loss_config(Config::load_from_string(kAlgoDefaultsYaml, "", "test", {}).subtree("actor"));
  EXPECT_FALSE(defaults.loss_scale_factor.has_value());  // verl's null: the batch's response length
  EXPECT_EQ(defaults.loss_mode, PolicyLossMode::kVanilla);
  auto cfg = Config::load_from_string(kAlgoDefaultsYaml, "", "test",
                                      {"actor.loss_scale_factor=4096", "actor.policy_loss.loss_mode=gspo",
                                       "actor.loss_agg_mode=token-sum"});
  auto loss = policy_loss_config(cfg.subtree("actor"));
  EXPECT_DOUBLE_EQ(loss.loss_scale_factor.value(), 4096.0);
  EXPECT_EQ(loss.loss_mode, PolicyLossMode::kGspo);
  EXPECT_EQ(loss.agg_mode, LossAggMode::kTokenSum);
  EXPECT_EQ(loss.policy_agg_mode(), LossAggMode::kSeqMeanTokenMean);
  auto bad = [](const std::string& override_) {
    return Config::load_from_string(kAlgoDefaultsYaml, "", "test", {override_}).subtree("actor");
  };
  EXPECT_THROW(policy_loss_config(bad("actor.policy_loss.loss_mode=opo")), Error);
  EXPECT_THROW(policy_loss_config(bad("actor.loss_scale_factor=0")), Error);
}

TEST(AlgoConfig, WarnsWhenClipRatioDiffersFromVerlsDefaultSides) {
  // clip_ratio 0.3 with both sides null: hybridflow clips at [0.7, 1.3], verl at [0.8, 1.2].
  ::testing::internal::CaptureStderr();
  auto actor = [](const std::vector<std::string>& overrides) {
    return Config::load_from_string(kAlgoDefaultsYaml, "", "test", overrides).subtree("actor");
  };
  auto loss = policy_loss_config(actor({"actor.clip_ratio=0.3"}));
  const std::string warned = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(warned.find("clip_ratio_low and clip_ratio_high are null"), std::string::npos) << warned;
  EXPECT_NE(warned.find("0.2"), std::string::npos) << warned;
  EXPECT_DOUBLE_EQ(loss.clip_ratio, 0.3);  // the behaviour stays hybridflow's
  // Both sides set, or clip_ratio at verl's 0.2: nothing to warn about.
  ::testing::internal::CaptureStderr();
  policy_loss_config(actor({"actor.clip_ratio=0.35", "actor.clip_ratio_low=0.2", "actor.clip_ratio_high=0.28"}));
  policy_loss_config(actor({"actor.clip_ratio=0.2"}));
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
}

TEST(AlgoConfig, MissingKeysAndBadNamesFailNamingThem) {
  // The defaults are the schema fragments' only: a schema without a key is an error naming it.
  auto bare = Config::load_from_string("algorithm:\n  gamma: 0.9\n", "", "test", {});
  try {
    advantage_params(bare.subtree("algorithm"));
    ADD_FAILURE() << "expected an error for the missing algorithm.lam";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("lam"), std::string::npos) << e.what();
  }
  auto bad = Config::load_from_string(kAlgoDefaultsYaml, "", "test", {"algorithm.adv_estimator=ppo2"});
  EXPECT_THROW(advantage_estimator_name(bad.subtree("algorithm")), Error);
}

}  // namespace
}  // namespace hybridflow::algo
