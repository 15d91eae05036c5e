// verl's rollout correction: importance weights (truncated or masked, per token, sequence or geometric mean,
// optionally batch-normalised) and rejection (rollout_rs at the same levels, verl's chained divergence-estimator
// criteria such as token_k1,seq_max_k2, the token veto) against the
// rollout's log-probs, checked against the formulas written out by hand with their spread metrics; the policy
// loss scales each token by the weights, and verl's bypass REINFORCE loss.
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

// The log-ratios old - rollout at the valid tokens: row 0 {0.5, -1, 0}, row 1 {1.9}.
RolloutCorrectionConfig config_of(RolloutCorrLevel level, double threshold) {
  RolloutCorrectionConfig c;
  c.is_level = level;
  c.is_threshold = threshold;
  return c;
}

RolloutCorrectionConfig rejecting(RolloutCorrLevel level, double lower, double upper) {
  RolloutCorrectionConfig c;
  c.rs_level = level;
  c.rs_threshold = upper;
  c.rs_threshold_lower = lower;
  return c;
}

void expect_tensor_near(const at::Tensor& got, const std::vector<std::vector<double>>& want, double tol = 1e-6) {
  ASSERT_EQ(got.size(0), static_cast<int64_t>(want.size()));
  for (size_t i = 0; i < want.size(); ++i)
    for (size_t j = 0; j < want[i].size(); ++j)
      EXPECT_NEAR(got[i][j].item<double>(), want[i][j], tol) << i << "," << j;
}

TEST(RolloutCorrection, TokenWeightsAreTheTruncatedRatioAndZeroAtPadding) {
  const auto rc = rollout_correction(kOld, kRollout, kMask, config_of(RolloutCorrLevel::kToken, 2.0));
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
  const auto rc = rollout_correction(kOld, kRollout, kMask, config_of(RolloutCorrLevel::kSequence, 5.0));
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
  const auto same = rollout_correction(kOld, kOld, kMask, config_of(RolloutCorrLevel::kToken, 2.0));
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
  EXPECT_EQ(load({}).is_level, RolloutCorrLevel::kOff);
  EXPECT_FALSE(load({}).rejects());
  const auto c = load({"algorithm.rollout_correction.rollout_is=token", "algorithm.rollout_correction.rollout_is_threshold=3"});
  EXPECT_EQ(c.is_level, RolloutCorrLevel::kToken);
  EXPECT_EQ(c.is_threshold, 3.0);
  EXPECT_FALSE(c.is_threshold_lower.has_value());
  EXPECT_EQ(load({"algorithm.rollout_correction.rollout_is=sequence"}).is_level, RolloutCorrLevel::kSequence);
  EXPECT_EQ(load({"algorithm.rollout_correction.rollout_is=geometric"}).is_level, RolloutCorrLevel::kGeometric);
  const std::string bad = testing::error_of([&] { load({"algorithm.rollout_correction.rollout_is=bogus"}); });
  EXPECT_NE(bad.find("algorithm.rollout_correction.rollout_is"), std::string::npos) << bad;
  const std::string cap = testing::error_of([&] { load({"algorithm.rollout_correction.rollout_is_threshold=0"}); });
  EXPECT_NE(cap.find("rollout_is_threshold"), std::string::npos) << cap;
}

TEST(RolloutCorrection, ConfigReadsMaskedThresholdsRejectionVetoAndLossType) {
  auto load = [](const std::vector<std::string>& overrides) {
    return rollout_correction_config(Config::load_from_string(kAlgorithmSectionYaml, "", "t", overrides).subtree("algorithm"));
  };
  const auto masked = load({"algorithm.rollout_correction.rollout_is_threshold=0.5_3"});
  EXPECT_EQ(masked.is_threshold, 3.0);
  EXPECT_EQ(masked.is_threshold_lower.value_or(0), 0.5);
  const auto rs = load({"algorithm.rollout_correction.rollout_rs=geometric", "algorithm.rollout_correction.rollout_rs_threshold=4",
                        "algorithm.rollout_correction.rollout_is_batch_normalize=true",
                        "algorithm.rollout_correction.rollout_token_veto_threshold=1e-4",
                        "algorithm.rollout_correction.loss_type=reinforce"});
  EXPECT_EQ(rs.rs_level, RolloutCorrLevel::kGeometric);
  EXPECT_EQ(rs.rs_threshold, 4.0);
  EXPECT_EQ(rs.rs_threshold_lower, 0.25);  // null: the reciprocal of the upper bound
  EXPECT_TRUE(rs.is_batch_normalize);
  EXPECT_EQ(rs.token_veto_threshold.value_or(0), 1e-4);
  EXPECT_EQ(rs.loss_type, RolloutLossType::kReinforce);
  EXPECT_TRUE(rs.rejects());
  EXPECT_EQ(load({"algorithm.rollout_correction.rollout_rs=token", "algorithm.rollout_correction.rollout_rs_threshold=2",
                  "algorithm.rollout_correction.rollout_rs_threshold_lower=0.9"})
                .rs_threshold_lower,
            0.9);
  // The worker receives the same config through a call's meta.
  const auto back = rollout_correction_config_from_json(to_json(rs));
  EXPECT_EQ(back.rs_level, rs.rs_level);
  EXPECT_EQ(back.rs_threshold_lower, rs.rs_threshold_lower);
  EXPECT_EQ(back.token_veto_threshold, rs.token_veto_threshold);
  EXPECT_EQ(back.loss_type, rs.loss_type);
  EXPECT_EQ(rollout_correction_config_from_json(to_json(masked)).is_threshold_lower, masked.is_threshold_lower);

  auto error = [&](const std::vector<std::string>& o) { return testing::error_of([&] { load(o); }); };
  EXPECT_NE(error({"algorithm.rollout_correction.rollout_rs=token"}).find("rollout_rs_threshold must be set"),
            std::string::npos);
  EXPECT_NE(error({"algorithm.rollout_correction.rollout_is_threshold=3_2"}).find("lower bound"), std::string::npos);
  EXPECT_NE(error({"algorithm.rollout_correction.rollout_is_threshold=a_2"}).find("rollout_is_threshold"),
            std::string::npos);
  EXPECT_NE(error({"algorithm.rollout_correction.rollout_rs=token", "algorithm.rollout_correction.rollout_rs_threshold=2",
                   "algorithm.rollout_correction.rollout_rs_threshold_lower=3"})
                .find("rollout_rs_threshold_lower"),
            std::string::npos);
  EXPECT_NE(error({"algorithm.rollout_correction.loss_type=gspo"}).find("loss_type"), std::string::npos);
  EXPECT_NE(error({"algorithm.rollout_correction.rollout_rs=seq_sum_k1"}).find("rollout_rs"), std::string::npos);
}

TEST(RolloutCorrection, GeometricWeightsUseTheMeanLogRatio) {
  const auto rc = rollout_correction(kOld, kRollout, kMask, config_of(RolloutCorrLevel::kGeometric, 2.0));
  // Row 0: exp((0.5 - 1 + 0) / 3); row 1: e^1.9 truncated to 2; padding 0.
  const double row0 = std::exp(-0.5 / 3);
  expect_tensor_near(rc.weights, {{row0, row0, row0}, {2.0, 0.0, 0.0}});
  // Per sequence: max e^1.9, min row 0's, one of two sequences beyond the cap.
  EXPECT_NEAR(rc.metrics.at("rollout_corr/rollout_is_max"), std::exp(1.9), 1e-4);
  EXPECT_NEAR(rc.metrics.at("rollout_corr/rollout_is_min"), row0, 1e-6);
  EXPECT_NEAR(rc.metrics.at("rollout_corr/rollout_is_ratio_fraction_high"), 0.5, 1e-9);
  EXPECT_NEAR(rc.metrics.at("rollout_corr/rollout_is_ratio_fraction_low"), 0.0, 1e-9);
  // The mean is over tokens: three of row 0's and one of row 1's (untruncated).
  EXPECT_NEAR(rc.metrics.at("rollout_corr/rollout_is_mean"), (3 * row0 + std::exp(1.9)) / 4, 1e-5);
}

TEST(RolloutCorrection, MaskedWeightsAreZeroOutsideTheBounds) {
  RolloutCorrectionConfig c = config_of(RolloutCorrLevel::kToken, 2.0);
  c.is_threshold_lower = 0.5;
  const auto rc = rollout_correction(kOld, kRollout, kMask, c);
  // e^0.5 kept, e^-1 < 0.5 and e^1.9 > 2 zeroed (not truncated), 1 kept.
  expect_tensor_near(rc.weights, {{std::exp(0.5), 0.0, 1.0}, {0.0, 0.0, 0.0}});
  EXPECT_NEAR(rc.metrics.at("rollout_corr/rollout_is_ratio_fraction_low"), 0.25, 1e-9);
  EXPECT_FALSE(rc.keep_mask.defined());  // weights only: nothing leaves the loss's denominator
}

TEST(RolloutCorrection, SpreadMetricsAreThoseOfTheWeightsClampedToTheThresholds) {
  const auto rc = rollout_correction(kOld, kRollout, kMask, config_of(RolloutCorrLevel::kToken, 2.0));
  // Clamped to [1/2, 2]: {e^0.5, 0.5, 1, 2}.
  const double w[4] = {std::exp(0.5), 0.5, 1.0, 2.0};
  double mean = 0, sq = 0;
  for (double x : w) mean += x / 4, sq += x * x / 4;
  EXPECT_NEAR(rc.metrics.at("rollout_corr/rollout_is_std"), std::sqrt(sq - mean * mean), 1e-6);
  EXPECT_NEAR(rc.metrics.at("rollout_corr/rollout_is_eff_sample_size"), mean * mean / sq, 1e-6);
  EXPECT_NEAR(rc.metrics.at("rollout_corr/rollout_is_min"), std::exp(-1.0), 1e-6);
  EXPECT_NEAR(rc.metrics.at("rollout_corr/rollout_is_ratio_fraction_low"), 0.25, 1e-9);
  // Identical policies: every weight 1, no spread, a full effective sample.
  const auto same = rollout_correction(kOld, kOld, kMask, config_of(RolloutCorrLevel::kToken, 2.0));
  EXPECT_NEAR(same.metrics.at("rollout_corr/rollout_is_std"), 0.0, 1e-9);
  EXPECT_NEAR(same.metrics.at("rollout_corr/rollout_is_eff_sample_size"), 1.0, 1e-6);
}

TEST(RolloutCorrection, BatchNormalizeScalesTheWeightsToMeanOne) {
  RolloutCorrectionConfig token = config_of(RolloutCorrLevel::kToken, 2.0);
  token.is_batch_normalize = true;
  const auto t = rollout_correction(kOld, kRollout, kMask, token);
  const double mean = (std::exp(0.5) + std::exp(-1.0) + 1.0 + 2.0) / 4;  // of the truncated token weights
  EXPECT_NEAR(t.metrics.at("rollout_corr/rollout_is_batch_norm_factor"), mean, 1e-6);
  expect_tensor_near(t.weights, {{std::exp(0.5) / mean, std::exp(-1.0) / mean, 1.0 / mean}, {2.0 / mean, 0.0, 0.0}});
  // Sequence level: the mean over the two sequences' weights, e^-0.5 and 5 (truncated), not over tokens.
  RolloutCorrectionConfig seq = config_of(RolloutCorrLevel::kSequence, 5.0);
  seq.is_batch_normalize = true;
  const auto s = rollout_correction(kOld, kRollout, kMask, seq);
  const double seq_mean = (std::exp(-0.5) + 5.0) / 2;
  EXPECT_NEAR(s.metrics.at("rollout_corr/rollout_is_batch_norm_factor"), seq_mean, 1e-6);
  EXPECT_NEAR(s.weights[0][2].item<double>(), std::exp(-0.5) / seq_mean, 1e-6);
  EXPECT_NEAR(s.weights[1][0].item<double>(), 5.0 / seq_mean, 1e-6);
}

TEST(RolloutCorrection, TokenRejectionDropsTheTokensOutsideTheBounds) {
  const auto rc = rollout_correction(kOld, kRollout, kMask, rejecting(RolloutCorrLevel::kToken, 0.5, 2.0));
  EXPECT_FALSE(rc.weights.defined());  // rejection alone weighs nothing
  // e^-1 < 0.5 and e^1.9 > 2 rejected; padding stays 0.
  expect_tensor_near(rc.keep_mask, {{1.0, 0.0, 1.0}, {0.0, 0.0, 0.0}});
  EXPECT_NEAR(rc.metrics.at("rollout_corr/rollout_rs_masked_fraction"), 0.5, 1e-9);
  EXPECT_NEAR(rc.metrics.at("rollout_corr/rollout_rs_seq_masked_fraction"), 1.0, 1e-9);  // both rows lose a token
  EXPECT_NEAR(rc.metrics.at("rollout_corr/rollout_rs_ratio_fraction_high"), 0.25, 1e-9);
  EXPECT_NEAR(rc.metrics.at("rollout_corr/rollout_rs_ratio_fraction_low"), 0.25, 1e-9);
  EXPECT_NEAR(rc.metrics.at("rollout_corr/rejected_fraction"), 0.5, 1e-9);
}

TEST(RolloutCorrection, SequenceAndGeometricRejectionJudgeWholeRows) {
  // Bounds [0.8, 1.2]: row 0's product e^-0.5 = 0.61 falls below, its geometric mean e^(-1/6) = 0.85 does not;
  // row 1 (e^1.9 either way) is rejected by both.
  const auto seq = rollout_correction(kOld, kRollout, kMask, rejecting(RolloutCorrLevel::kSequence, 0.8, 1.2));
  expect_tensor_near(seq.keep_mask, {{0.0, 0.0, 0.0}, {0.0, 0.0, 0.0}});
  EXPECT_NEAR(seq.metrics.at("rollout_corr/rollout_rs_seq_masked_fraction"), 1.0, 1e-9);
  EXPECT_NEAR(seq.metrics.at("rollout_corr/rollout_rs_ratio_fraction_low"), 0.5, 1e-9);
  const auto geo = rollout_correction(kOld, kRollout, kMask, rejecting(RolloutCorrLevel::kGeometric, 0.8, 1.2));
  expect_tensor_near(geo.keep_mask, {{1.0, 1.0, 1.0}, {0.0, 0.0, 0.0}});
  EXPECT_NEAR(geo.metrics.at("rollout_corr/rollout_rs_masked_fraction"), 0.25, 1e-9);  // 1 of 4 valid tokens
  EXPECT_NEAR(geo.metrics.at("rollout_corr/rollout_rs_seq_masked_fraction"), 0.5, 1e-9);
  EXPECT_NEAR(geo.metrics.at("rollout_corr/rollout_rs_min"), std::exp(-0.5 / 3), 1e-6);
  EXPECT_NEAR(geo.metrics.at("rollout_corr/rollout_rs_max"), std::exp(1.9), 1e-4);
}

TEST(RolloutCorrection, VetoRejectsEverySequenceWithACatastrophicToken) {
  RolloutCorrectionConfig c;
  c.token_veto_threshold = 0.5;
  const auto rc = rollout_correction(kOld, kRollout, kMask, c);
  // Row 0 holds e^-1 < 0.5: all of it goes. Row 1's padding (log-ratio -10) is not a token and vetoes nothing.
  expect_tensor_near(rc.keep_mask, {{0.0, 0.0, 0.0}, {1.0, 0.0, 0.0}});
  EXPECT_NEAR(rc.metrics.at("rollout_corr/rollout_is_veto_fraction"), 0.5, 1e-9);
  EXPECT_NEAR(rc.metrics.at("rollout_corr/rollout_is_catastrophic_token_fraction"), 0.25, 1e-9);
  EXPECT_NEAR(rc.metrics.at("rollout_corr/rejected_fraction"), 0.75, 1e-9);
  // With token rejection too: row 1's token (e^1.9 > 2) also goes.
  RolloutCorrectionConfig both = rejecting(RolloutCorrLevel::kToken, 0.1, 2.0);
  both.token_veto_threshold = 0.5;
  EXPECT_NEAR(rollout_correction(kOld, kRollout, kMask, both).metrics.at("rollout_corr/rejected_fraction"), 1.0, 1e-9);
}

TEST(RolloutCorrection, ReinforceLossIsMinusAdvantageTimesWeightTimesLogProb) {
  const auto rollout = torch::tensor({{-1.0, -2.0, -0.5}, {-0.3, 0.0, 0.0}});
  const auto lp = torch::tensor({{-0.9, -2.2, -0.5}, {-0.2, std::nan(""), 5.0}}).requires_grad_(true);
  const auto adv = torch::tensor({{1.0, 1.0, 1.0}, {-2.0, 7.0, 7.0}});
  const auto w = torch::tensor({{1.0, 0.5, 2.0}, {1.5, 9.0, 9.0}});
  const auto out = reinforce_policy_loss(rollout, lp, adv, kMask, LossAggMode::kTokenMean, std::nullopt, w);
  // -(1 * 1 * -0.9 + 1 * 0.5 * -2.2 + 1 * 2 * -0.5 + -2 * 1.5 * -0.2) / 4 = -(-0.9 - 1.1 - 1.0 + 0.6) / 4 = 0.6
  EXPECT_NEAR(out.loss.item<double>(), 0.6, 1e-6);
  out.loss.backward();
  // d/d lp = -A w / 4 at valid tokens, 0 (not NaN) at padding.
  expect_tensor_near(lp.grad(), {{-0.25, -0.125, -0.5}, {0.75, 0.0, 0.0}});
  // approx_kl: mean of rollout - lp = (-0.1 + 0.2 + 0 - 0.1) / 4 = 0.
  EXPECT_NEAR(out.approx_kl.item<double>(), 0.0, 1e-6);
  EXPECT_EQ(out.clip_frac.item<double>(), 0.0);
  // Without weights: plain REINFORCE.
  const auto plain = reinforce_policy_loss(rollout, lp.detach(), adv, kMask, LossAggMode::kTokenMean, std::nullopt);
  EXPECT_NEAR(plain.loss.item<double>(), -(-0.9 - 2.2 - 0.5 + (-2.0) * (-0.2)) / 4, 1e-6);
}

}  // namespace
}  // namespace hybridflow::algo

namespace hybridflow::algo {
namespace {

RolloutCorrectionConfig config_with_rs(const std::string& rs, const std::string& threshold,
                                       const std::vector<std::string>& more = {}) {
  std::vector<std::string> o = {"algorithm.rollout_correction.rollout_rs=" + rs,
                                "algorithm.rollout_correction.rollout_rs_threshold='" + threshold + "'"};
  o.insert(o.end(), more.begin(), more.end());
  return rollout_correction_config(Config::load_from_string(kAlgorithmSectionYaml, "", "t", o).subtree("algorithm"));
}

// verl's chained criteria: the config keeps each with its bounds (k1: lower_upper, or 1/u..u from one number;
// one threshold for all or one each) and crosses the worker call's meta; malformed ones name the key.
TEST(RolloutCorrection, DivergenceCriteriaConfigAsVerlSpellsThem) {
  const auto c = config_with_rs("token_k1,seq_max_k2", "0.6_1.6,2.5");
  ASSERT_EQ(c.rs_criteria.size(), 2u);
  EXPECT_EQ(c.rs_level, RolloutCorrLevel::kOff);
  EXPECT_TRUE(c.rejects());
  EXPECT_EQ(c.rs_criteria[0].scope, "token");
  EXPECT_EQ(c.rs_criteria[0].estimator, 1);
  EXPECT_DOUBLE_EQ(c.rs_criteria[0].lower, 0.6);
  EXPECT_DOUBLE_EQ(c.rs_criteria[0].upper, 1.6);
  EXPECT_EQ(c.rs_criteria[1].scope, "seq_max");
  EXPECT_EQ(c.rs_criteria[1].estimator, 2);
  EXPECT_DOUBLE_EQ(c.rs_criteria[1].upper, 2.5);
  const auto shared = config_with_rs("seq_sum_k1, seq_mean_k3", "2");
  EXPECT_DOUBLE_EQ(shared.rs_criteria[0].lower, 0.5);
  EXPECT_DOUBLE_EQ(shared.rs_criteria[1].upper, 2.0);
  const auto back = rollout_correction_config_from_json(to_json(c));
  ASSERT_EQ(back.rs_criteria.size(), 2u);
  EXPECT_EQ(back.rs_criteria[1].name, "seq_max_k2");
  EXPECT_DOUBLE_EQ(back.rs_criteria[0].lower, 0.6);
  auto error = [](const std::string& rs, const std::string& t, const std::vector<std::string>& more = {}) {
    return testing::error_of([&] { config_with_rs(rs, t, more); });
  };
  EXPECT_NE(error("token_k5", "2").find("rollout_rs: 'token_k5' is not one of"), std::string::npos);
  EXPECT_NE(error("seq_max_k1", "2").find("'seq_max_k1'"), std::string::npos);
  EXPECT_NE(error("token_k1,token_k2", "1,2,3").find("gives 3 thresholds for the 2 criteria"), std::string::npos);
  EXPECT_NE(error("token_k2", "1_2").find("token_k2 takes one upper bound"), std::string::npos);
  EXPECT_NE(error("token_k1", "2_1").find("rollout_rs_threshold: the lower bound must not exceed the upper, got '2_1'"),
            std::string::npos);
  EXPECT_NE(error("token_k1", "0.5_2", {"algorithm.rollout_correction.rollout_rs_threshold_lower=0.4"})
                .find("rollout_rs_threshold_lower applies to the ratio levels"),
            std::string::npos);
}

// Log-ratios at the valid tokens: row 0 {0.5, -1, 0}, row 1 {1.9}. token_k2 = lr^2 / 2: {0.125, 0.5, 0},
// {1.805}; seq_mean_k3 over e^lr - 1 - lr: row 0 (0.14872 + 0.36788 + 0) / 3 = 0.17220, row 1 3.78589.
// At 0.3 each, token_k2 drops row 0's second token and row 1's, seq_mean_k3 all of row 1: a token stays
// only where both keep it.
TEST(RolloutCorrection, ChainedDivergenceCriteriaRejectWhatAnyOfThemRejects) {
  const auto c = config_with_rs("token_k2,seq_mean_k3", "0.3");
  const RolloutCorrection r = rollout_correction(kOld, kRollout, kMask, c);
  expect_tensor_near(r.keep_mask, {{1, 0, 1}, {0, 0, 0}});
  EXPECT_NEAR(r.metrics.at("rollout_corr/rollout_rs_token_k2_masked_fraction"), 0.5, 1e-9);
  EXPECT_NEAR(r.metrics.at("rollout_corr/rollout_rs_token_k2_seq_masked_fraction"), 1.0, 1e-9);
  EXPECT_NEAR(r.metrics.at("rollout_corr/rollout_rs_token_k2_max"), 1.805, 1e-6);
  EXPECT_NEAR(r.metrics.at("rollout_corr/rollout_rs_seq_mean_k3_masked_fraction"), 0.25, 1e-9);
  EXPECT_NEAR(r.metrics.at("rollout_corr/rollout_rs_seq_mean_k3_seq_masked_fraction"), 0.5, 1e-9);
  EXPECT_NEAR(r.metrics.at("rollout_corr/rollout_rs_seq_mean_k3_mean"), (0.172201 + 3.785894) / 2, 1e-5);
  EXPECT_NEAR(r.metrics.at("rollout_corr/rollout_rs_masked_fraction"), 0.5, 1e-9);
  EXPECT_NEAR(r.metrics.at("rollout_corr/rollout_rs_seq_masked_fraction"), 1.0, 1e-9);
  // token_k1 keeps -lr within [log 0.6, log 1.6] = [-0.511, 0.470]: row 0 {-0.5, 1, 0} -> {keep, drop, keep},
  // row 1 {-1.9} -> drop; seq_max_k2 at 1.0 keeps row 0 (max 0.5) and drops row 1 (1.805).
  expect_tensor_near(rollout_correction(kOld, kRollout, kMask, config_with_rs("token_k1", "0.6_1.6")).keep_mask,
                     {{1, 0, 1}, {0, 0, 0}});
  expect_tensor_near(rollout_correction(kOld, kRollout, kMask, config_with_rs("seq_max_k2", "1.0")).keep_mask,
                     {{1, 1, 1}, {0, 0, 0}});
  // A looser seq_max_k2 keeps everything, and padding stays out.
  expect_tensor_near(rollout_correction(kOld, kRollout, kMask, config_with_rs("seq_max_k2", "2.5")).keep_mask,
                     {{1, 1, 1}, {1, 0, 0}});
}

}  // namespace
}  // namespace hybridflow::algo
