// verl's rollout correction: truncated importance weights against the rollout's log-probs, per token or per
// sequence, checked against the formulas written out by hand; the policy loss scales each token by them,
// and without weights it is the same loss as before.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "hybridflow/algo/algo_config.h"
#include "hybridflow/algo/losses.h"
#include "hybridflow/algo/rollout_correction.h"
#include "hybridflow/core/config.h"
#include "support/error_of.h"

namespace hybridflow::algo {
namespace {

// Row 0: three valid tokens; row 1: one valid token then padding (whose log-probs are garbage).
const at::Tensor kOld = torch::tensor({{-1.0, -2.0, -0.5}, {-0.1, 50.0, -3.0}});
const at::Tensor kRollout = torch::tensor({{-1.5, -1.0, -0.5}, {-2.0, -9.0, 7.0}});
const at::Tensor kMask = torch::tensor({{1, 1, 1}, {1, 0, 0}});

RolloutCorrectionConfig config_of(RolloutIsLevel level, double threshold) {
  RolloutCorrectionConfig c;
  c.level = level;
  c.threshold = threshold;
  return c;
}

TEST(RolloutCorrection, TokenWeightsAreTheTruncatedRatioAndZeroAtPadding) {
  const auto rc = rollout_correction(kOld, kRollout, kMask, config_of(RolloutIsLevel::kToken, 2.0));
  ASSERT_TRUE(rc.weights.defined());
  // exp(old - rollout): e^0.5 = 1.65, e^-1 = 0.37, e^0 = 1; e^1.9 = 6.69 -> truncated to 2.
  const double want[2][3] = {{std::exp(0.5), std::exp(-1.0), 1.0}, {2.0, 0.0, 0.0}};
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j) EXPECT_NEAR(rc.weights[i][j].item<double>(), want[i][j], 1e-6) << i << "," << j;
  EXPECT_NEAR(rc.metrics.at("rollout_corr/rollout_is_max"), std::exp(1.9), 1e-4);
  EXPECT_NEAR(rc.metrics.at("rollout_corr/rollout_is_mean"),
              (std::exp(0.5) + std::exp(-1.0) + 1.0 + std::exp(1.9)) / 4, 1e-5);
  EXPECT_NEAR(rc.metrics.at("rollout_corr/rollout_is_ratio_fraction_high"), 0.25, 1e-9);
  // kl = mean(rollout - old) over the 4 valid tokens = (-0.5 + 1 + 0 - 1.9) / 4.
  EXPECT_NEAR(rc.metrics.at("rollout_corr/kl"), (-0.5 + 1.0 + 0.0 - 1.9) / 4, 1e-6);
  // log_ppl_diff = mean over rows of the row's mean (old - rollout): (0.5 - 1 + 0) / 3 and 1.9.
  EXPECT_NEAR(rc.metrics.at("rollout_corr/log_ppl_diff"), ((0.5 - 1.0) / 3 + 1.9) / 2, 1e-6);
}

TEST(RolloutCorrection, SequenceWeightsUseTheProductOverTheResponse) {
  const auto rc = rollout_correction(kOld, kRollout, kMask, config_of(RolloutIsLevel::kSequence, 5.0));
  // Row 0: e^(0.5 - 1 + 0) = 0.61 on every valid token; row 1: e^1.9 = 6.69 truncated to 5.
  for (int j = 0; j < 3; ++j) EXPECT_NEAR(rc.weights[0][j].item<double>(), std::exp(-0.5), 1e-6);
  EXPECT_NEAR(rc.weights[1][0].item<double>(), 5.0, 1e-6);
  EXPECT_EQ(rc.weights[1][1].item<double>(), 0.0);
}

TEST(RolloutCorrection, OffLogsTheMismatchOnlyAndIdenticalPoliciesWeighOne) {
  const auto off = rollout_correction(kOld, kRollout, kMask, {});
  EXPECT_FALSE(off.weights.defined());
  EXPECT_FALSE(off.metrics.count("rollout_corr/rollout_is_mean"));
  EXPECT_TRUE(off.metrics.count("rollout_corr/k3_kl"));
  const auto same = rollout_correction(kOld, kOld, kMask, config_of(RolloutIsLevel::kToken, 2.0));
  EXPECT_TRUE(torch::equal(same.weights, kMask.to(torch::kFloat)));
  EXPECT_EQ(same.metrics.at("rollout_corr/kl"), 0.0);
  EXPECT_EQ(same.metrics.at("rollout_corr/k3_kl"), 0.0);
}

TEST(RolloutCorrection, PolicyLossScalesEachTokenByItsWeight) {
  torch::manual_seed(3);
  const auto old = torch::randn({2, 3}) * 0.1 - 1.0;
  const auto lp = (old + torch::randn({2, 3}) * 0.05).requires_grad_(true);
  const auto adv = torch::randn({2, 3});
  const auto mask = kMask;
  PolicyLossConfig cfg;
  cfg.agg_mode = LossAggMode::kTokenSum;
  const auto plain = policy_loss(old, lp, adv, mask, cfg);
  const auto ones = policy_loss(old, lp, adv, mask, cfg, torch::ones({2, 3}));
  EXPECT_EQ(plain.loss.item<double>(), ones.loss.item<double>());
  // A weight of 2 on one token and 0 on another: the token-sum loss moves by exactly those tokens' losses.
  const auto w = torch::tensor({{2.0, 0.0, 1.0}, {1.0, 1.0, 1.0}});
  PolicyLossConfig unclipped = cfg;
  unclipped.clip_ratio = 0.99;  // the ratios stay inside the clip range: each token's loss is -A r
  const auto base = policy_loss(old, lp, adv, mask, unclipped);
  const auto weighted = policy_loss(old, lp, adv, mask, unclipped, w);
  const auto token = (-adv * torch::exp(lp - old)).detach();
  const double want = base.loss.item<double>() + token[0][0].item<double>() - token[0][1].item<double>();
  EXPECT_NEAR(weighted.loss.item<double>(), want, 1e-5);
}

TEST(RolloutCorrection, ConfigReadsVerlKeysAndRejectsOthers) {
  auto load = [](const std::vector<std::string>& overrides) {
    return rollout_correction_config(Config::load_from_string(kAlgorithmSectionYaml, "", "t", overrides).subtree("algorithm"));
  };
  EXPECT_EQ(load({}).level, RolloutIsLevel::kOff);
  const auto c = load({"algorithm.rollout_correction.rollout_is=token", "algorithm.rollout_correction.rollout_is_threshold=3"});
  EXPECT_EQ(c.level, RolloutIsLevel::kToken);
  EXPECT_EQ(c.threshold, 3.0);
  EXPECT_EQ(load({"algorithm.rollout_correction.rollout_is=sequence"}).level, RolloutIsLevel::kSequence);
  const std::string bad = testing::error_of([&] { load({"algorithm.rollout_correction.rollout_is=geometric"}); });
  EXPECT_NE(bad.find("algorithm.rollout_correction.rollout_is"), std::string::npos) << bad;
  const std::string cap = testing::error_of([&] { load({"algorithm.rollout_correction.rollout_is_threshold=0"}); });
  EXPECT_NE(cap.find("rollout_is_threshold"), std::string::npos) << cap;
}

}  // namespace
}  // namespace hybridflow::algo
