#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "algo/algo_test_util.h"
#include "hybridflow/algo/kl.h"
#include "hybridflow/algo/losses.h"
#include "hybridflow/algo/masked.h"
#include "hybridflow/algo/safe_rlhf.h"
#include "hybridflow/core/error.h"

namespace hybridflow::algo {
namespace {

using testing::Rows;
using testing::to_rows;
using testing::to_tensor;

const Rows kMask = {{1, 1, 1}, {1, 0, 0}, {1, 1, 0}};
const Rows kLoss = {{1.0, 2.0, 3.0}, {4.0, 100.0, -100.0}, {-1.0, 5.0, 7.0}};

double scalar(const at::Tensor& t) { return t.item<double>(); }

TEST(AlgoMasked, MeanVarWhitenOverValidTokensOnly) {
  auto v = to_tensor(kLoss), m = to_tensor(kMask);
  auto [mean, var] = testing::masked_moments(kLoss, kMask);
  EXPECT_NEAR(scalar(masked_mean(v, m)), mean, 1e-6);
  EXPECT_NEAR(scalar(masked_var(v, m)), var, 1e-5);
  EXPECT_NEAR(scalar(masked_sum(v, m)), 1 + 2 + 3 + 4 - 1 + 5, 1e-6);
  auto row_mean = masked_mean(v, m, 1);
  EXPECT_NEAR(scalar(row_mean[0]), 2.0, 1e-6);
  EXPECT_NEAR(scalar(row_mean[1]), 4.0, 1e-6);
  EXPECT_NEAR(scalar(row_mean[2]), 2.0, 1e-6);
  EXPECT_ROWS_NEAR(to_rows(masked_whiten(v, m)), testing::whiten_ref(kLoss, kMask), 1e-5);
}

TEST(AlgoMasked, IntegerAndBoolMasksActLikeFloat) {
  auto v = to_tensor(kLoss), m = to_tensor(kMask);
  for (auto dtype : {torch::kLong, torch::kInt, torch::kBool}) {
    auto im = m.to(dtype);
    EXPECT_NEAR(scalar(masked_mean(v, im)), scalar(masked_mean(v, m)), 1e-7);
    EXPECT_TRUE(torch::allclose(masked_whiten(v, im), masked_whiten(v, m)));
    EXPECT_NEAR(scalar(agg_loss(v, im, LossAggMode::kSeqMeanTokenMean)),
                scalar(agg_loss(v, m, LossAggMode::kSeqMeanTokenMean)), 1e-7);
  }
}

TEST(AlgoMasked, EmptyAndSingleMasksStayFinite) {
  auto v = to_tensor(kLoss);
  auto none = torch::zeros_like(v);
  EXPECT_EQ(scalar(masked_mean(v, none)), 0.0);
  EXPECT_EQ(scalar(masked_var(v, none)), 0.0);
  auto one = torch::zeros_like(v);
  one[1][0] = 1;
  EXPECT_EQ(scalar(masked_var(v, one)), 0.0);
  EXPECT_FALSE(masked_whiten(v, one).isnan().any().item<bool>());
  EXPECT_THROW(masked_mean(v, torch::ones({3, 2})), Error);
}

TEST(AlgoMasked, AggregationModes) {
  auto v = to_tensor(kLoss), m = to_tensor(kMask);
  // Valid tokens per row: {1,2,3}, {4}, {-1,5}.
  EXPECT_NEAR(scalar(agg_loss(v, m, parse_loss_agg_mode("token-mean"))), 14.0 / 6.0, 1e-6);
  EXPECT_NEAR(scalar(agg_loss(v, m, parse_loss_agg_mode("seq-mean-token-sum"))), (6.0 + 4.0 + 4.0) / 3.0, 1e-6);
  EXPECT_NEAR(scalar(agg_loss(v, m, parse_loss_agg_mode("seq-mean-token-mean"))), (2.0 + 4.0 + 2.0) / 3.0, 1e-6);
  // Dr. GRPO: 14 over N = 3 sequences over R = 3 (the default loss_scale_factor), or over 7 when set.
  EXPECT_NEAR(scalar(agg_loss(v, m, parse_loss_agg_mode("seq-mean-token-sum-norm"))), 14.0 / 3.0 / 3.0, 1e-6);
  EXPECT_NEAR(scalar(agg_loss(v, m, LossAggMode::kSeqMeanTokenSumNorm, 7.0)), 14.0 / 3.0 / 7.0, 1e-6);
  EXPECT_NEAR(scalar(agg_loss(v, m, parse_loss_agg_mode("token-sum"))), 14.0, 1e-6);
  // loss_scale_factor only concerns seq-mean-token-sum-norm.
  EXPECT_NEAR(scalar(agg_loss(v, m, LossAggMode::kTokenSum, 7.0)), 14.0, 1e-6);
  EXPECT_THROW(agg_loss(v, m, LossAggMode::kSeqMeanTokenSumNorm, 0.0), Error);
  for (auto mode : {LossAggMode::kTokenMean, LossAggMode::kSeqMeanTokenSum, LossAggMode::kSeqMeanTokenMean,
                    LossAggMode::kSeqMeanTokenSumNorm, LossAggMode::kTokenSum})
    EXPECT_EQ(parse_loss_agg_mode(to_string(mode)), mode);
  EXPECT_THROW(parse_loss_agg_mode("token_mean"), Error);
}

// 4 rows x R = 3; row 1 is all padding. Valid sums per row: 6, -, 4, 2 (N = 3 non-empty rows, 6 tokens).
const Rows kGapLoss = {{1.0, 2.0, 3.0}, {4.0, 100.0, -100.0}, {-1.0, 5.0, 7.0}, {2.0, 2.0, 2.0}};
const Rows kGapMask = {{1, 1, 1}, {0, 0, 0}, {1, 1, 0}, {1, 0, 0}};

TEST(AlgoMasked, SeqMeanModesCountOnlyRowsWithTokens) {
  auto v = to_tensor(kGapLoss), m = to_tensor(kGapMask);
  EXPECT_EQ(non_empty_rows(m), 3);
  EXPECT_NEAR(scalar(agg_loss(v, m, LossAggMode::kTokenMean)), 12.0 / 6.0, 1e-6);
  EXPECT_NEAR(scalar(agg_loss(v, m, LossAggMode::kTokenSum)), 12.0, 1e-6);
  EXPECT_NEAR(scalar(agg_loss(v, m, LossAggMode::kSeqMeanTokenSum)), 12.0 / 3.0, 1e-6);
  // Row means 2, 2, 2 over the 3 non-empty rows (the empty row is not a fourth 0).
  EXPECT_NEAR(scalar(agg_loss(v, m, LossAggMode::kSeqMeanTokenMean)), 6.0 / 3.0, 1e-6);
  EXPECT_NEAR(scalar(agg_loss(v, m, LossAggMode::kSeqMeanTokenSumNorm)), 12.0 / 3.0 / 3.0, 1e-6);
  EXPECT_EQ(scalar(agg_loss(v, torch::zeros_like(m), LossAggMode::kSeqMeanTokenSumNorm)), 0.0);
}

// The engine combines micro-batch losses weighted by their share of the non-empty rows (kRowMean) for the
// seq-mean modes and by 1 (kSum) for token-sum; that must give back the whole mini-batch's value.
TEST(AlgoMasked, SplitMiniBatchRecombinesToTheWholeValue) {
  auto v = to_tensor(kGapLoss, torch::kDouble), m = to_tensor(kGapMask, torch::kDouble);
  auto a_v = v.slice(0, 0, 2), a_m = m.slice(0, 0, 2), b_v = v.slice(0, 2, 4), b_m = m.slice(0, 2, 4);
  // seq-mean-token-sum-norm: whole 12 / 3 / 3 = 4/3. Micro-batch A (rows 0-1): 6 / 1 / 3 = 2 over 1 row;
  // B (rows 2-3): (4 + 2) / 2 / 3 = 1 over 2 rows; 2 * 1/3 + 1 * 2/3 = 4/3. (Summing them, 3, was the old
  // combination: the whole value times the rows.)
  const auto norm = LossAggMode::kSeqMeanTokenSumNorm;
  EXPECT_NEAR(scalar(agg_loss(a_v, a_m, norm)), 2.0, 1e-12);
  EXPECT_NEAR(scalar(agg_loss(b_v, b_m, norm)), 1.0, 1e-12);
  EXPECT_NEAR(scalar(agg_loss(a_v, a_m, norm)) * 1.0 / 3.0 + scalar(agg_loss(b_v, b_m, norm)) * 2.0 / 3.0,
              scalar(agg_loss(v, m, norm)), 1e-12);
  EXPECT_NEAR(scalar(agg_loss(v, m, norm)), 4.0 / 3.0, 1e-12);
  for (auto mode : {LossAggMode::kSeqMeanTokenSum, LossAggMode::kSeqMeanTokenMean}) {
    const double a = non_empty_rows(a_m), b = non_empty_rows(b_m);
    EXPECT_NEAR((scalar(agg_loss(a_v, a_m, mode)) * a + scalar(agg_loss(b_v, b_m, mode)) * b) / (a + b),
                scalar(agg_loss(v, m, mode)), 1e-12)
        << to_string(mode);
  }
  // token-sum: 6 + 6 = 12, a plain sum.
  EXPECT_NEAR(scalar(agg_loss(a_v, a_m, LossAggMode::kTokenSum)) + scalar(agg_loss(b_v, b_m, LossAggMode::kTokenSum)),
              12.0, 1e-12);
}

TEST(AlgoMasked, NanAndInfAtMaskedPositionsDoNotPoison) {
  // kLoss with NaN and inf where kMask is 0 ({1,1} and {1,2}, {2,2}): every mode still sees 14 over 6 tokens.
  Rows dirty = kLoss;
  dirty[1][1] = std::nan("");
  dirty[1][2] = std::numeric_limits<double>::infinity();
  dirty[2][2] = -std::numeric_limits<double>::infinity();
  auto v = to_tensor(dirty), m = to_tensor(kMask);
  EXPECT_NEAR(scalar(agg_loss(v, m, LossAggMode::kTokenMean)), 14.0 / 6.0, 1e-6);
  EXPECT_NEAR(scalar(agg_loss(v, m, LossAggMode::kTokenSum)), 14.0, 1e-6);
  EXPECT_NEAR(scalar(agg_loss(v, m, LossAggMode::kSeqMeanTokenSum)), 14.0 / 3.0, 1e-6);
  EXPECT_NEAR(scalar(agg_loss(v, m, LossAggMode::kSeqMeanTokenMean)), 8.0 / 3.0, 1e-6);
  EXPECT_NEAR(scalar(agg_loss(v, m, LossAggMode::kSeqMeanTokenSumNorm)), 14.0 / 9.0, 1e-6);
  EXPECT_TRUE(torch::isfinite(masked_var(v, m)).item<bool>());
  EXPECT_TRUE(torch::isfinite(masked_whiten(v, m)).all().item<bool>());

  // Through the policy loss, with its gradient: a NaN log-prob and an inf advantage at padded positions.
  // log_prob = old_log_prob at the valid tokens (ratio 1, no clip), so each token's loss is -A and
  // token-mean gives -(1 + 2 + 3 + 4 - 1 + 5) / 6 = -14/6; d loss / d log_prob = -A / 6 there, 0 elsewhere.
  auto adv = to_tensor(dirty);
  auto old_lp = torch::zeros({3, 3});
  auto lp = torch::zeros({3, 3});
  lp[1][1] = std::nan("");
  lp[2][2] = std::numeric_limits<float>::infinity();
  lp.requires_grad_(true);
  auto out = ppo_policy_loss(old_lp, lp, adv, m);
  EXPECT_NEAR(scalar(out.loss), -14.0 / 6.0, 1e-6);
  out.loss.backward();
  EXPECT_TRUE(torch::isfinite(lp.grad()).all().item<bool>());
  EXPECT_NEAR(lp.grad()[0][2].item<double>(), -3.0 / 6.0, 1e-6);
  EXPECT_EQ(lp.grad()[1][1].item<double>(), 0.0);
  EXPECT_NEAR(scalar(out.approx_kl), 0.0, 1e-7);
}

// PPO per-token loss written as the case analysis of the paper + dual clip.
struct TokenLoss {
  double loss;
  bool clipped;
  bool dual_clipped;
};
TokenLoss ppo_token(double logp, double old_logp, double adv, double low, double high, double c) {
  const double r = std::exp(logp - old_logp);
  const double clipped_r = std::min(std::max(r, 1 - low), 1 + high);
  const double unclipped = -adv * r, clipped = -adv * clipped_r;
  double loss = std::max(unclipped, clipped);
  bool dual = false;
  if (adv < 0 && loss > -adv * c) loss = -adv * c, dual = true;
  return {loss, clipped > unclipped, dual};
}

TEST(AlgoPpoLoss, ClipDualClipFractionsAndKl) {
  // Ratios chosen per case: A>0 inside, A>0 above 1+high, A<0 below 1-low, A<0 far above c (dual clip),
  // A<0 between 1+high and c; the last is padding with an absurd ratio.
  const std::vector<double> ratio = {0.9, 1.5, 0.5, 5.0, 2.0, 1000.0};
  const std::vector<double> adv = {1.0, 2.0, -1.0, -0.5, -1.5, -3.0};
  const std::vector<double> mask = {1, 1, 1, 1, 1, 0};
  std::vector<double> old_lp, lp;
  for (double r : ratio) old_lp.push_back(-1.0), lp.push_back(-1.0 + std::log(r));
  PolicyLossConfig cfg;
  cfg.clip_ratio = 0.2;
  cfg.clip_ratio_c = 3.0;

  double sum = 0, clipped = 0, dual = 0, kl = 0;
  for (size_t i = 0; i < 5; ++i) {
    auto t = ppo_token(lp[i], old_lp[i], adv[i], 0.2, 0.2, 3.0);
    sum += t.loss, clipped += t.clipped, dual += t.dual_clipped, kl += old_lp[i] - lp[i];
  }
  ASSERT_EQ(clipped, 2);  // the test's cases cover what they claim to
  ASSERT_EQ(dual, 1);

  auto logp = to_tensor({lp}).requires_grad_(true);
  auto out = ppo_policy_loss(to_tensor({old_lp}), logp, to_tensor({adv}), to_tensor({mask}), cfg);
  EXPECT_NEAR(scalar(out.loss), sum / 5, 1e-5);
  EXPECT_NEAR(scalar(out.clip_frac), clipped / 5, 1e-6);
  EXPECT_NEAR(scalar(out.clip_frac_lower), dual / 5, 1e-6);
  EXPECT_NEAR(scalar(out.approx_kl), kl / 5, 1e-5);

  // Gradient flows only through unclipped tokens: d(-A r)/d logp = -A r / N.
  out.loss.backward();
  auto grad = to_rows(logp.grad())[0];
  EXPECT_NEAR(grad[0], -adv[0] * ratio[0] / 5, 1e-5);
  EXPECT_NEAR(grad[1], 0.0, 1e-7);  // clipped above
  EXPECT_NEAR(grad[2], 0.0, 1e-7);  // clipped below
  EXPECT_NEAR(grad[3], 0.0, 1e-7);  // dual clipped: constant -A c
  EXPECT_NEAR(grad[4], -adv[4] * ratio[4] / 5, 1e-4);
  EXPECT_EQ(grad[5], 0.0);  // padding
}

TEST(AlgoPpoLoss, AsymmetricClipHigher) {
  // r = 1.25 with A > 0: clipped by a symmetric 0.2, not by clip_ratio_high = 0.28.
  auto old_lp = torch::zeros({1, 1});
  auto lp = torch::full({1, 1}, std::log(1.25));
  auto adv = torch::ones({1, 1});
  auto m = torch::ones({1, 1});
  PolicyLossConfig sym;
  EXPECT_NEAR(scalar(ppo_policy_loss(old_lp, lp, adv, m, sym).loss), -1.2, 1e-6);
  PolicyLossConfig dapo;
  dapo.clip_ratio_low = 0.2;
  dapo.clip_ratio_high = 0.28;
  auto out = ppo_policy_loss(old_lp, lp, adv, m, dapo);
  EXPECT_NEAR(scalar(out.loss), -1.25, 1e-6);
  EXPECT_EQ(scalar(out.clip_frac), 0.0);
}

TEST(AlgoPpoLoss, RejectsBadClipRatioC) {
  auto t = torch::zeros({1, 2});
  PolicyLossConfig cfg;
  cfg.clip_ratio_c = 1.0;
  try {
    ppo_policy_loss(t, t, t, torch::ones({1, 2}), cfg);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("clip_ratio_c"), std::string::npos) << e.what();
  }
}

TEST(AlgoPpoLoss, LossScaleFactorAndTokenSumReachTheAggregation) {
  // Ratio 1 everywhere (log_prob = old_log_prob = 0): each valid token's loss is -A, with A = kLoss.
  auto zero = torch::zeros({3, 3});
  PolicyLossConfig cfg;
  cfg.agg_mode = LossAggMode::kSeqMeanTokenSumNorm;
  cfg.loss_scale_factor = 7.0;
  // -(6 + 4 + 4) / 3 sequences / 7.
  EXPECT_NEAR(scalar(policy_loss(zero, zero, to_tensor(kLoss), to_tensor(kMask), cfg).loss), -14.0 / 3.0 / 7.0,
              1e-6);
  cfg.agg_mode = LossAggMode::kTokenSum;
  EXPECT_NEAR(scalar(policy_loss(zero, zero, to_tensor(kLoss), to_tensor(kMask), cfg).loss), -14.0, 1e-6);
}

TEST(AlgoGspoLoss, SequenceRatioOnHandNumbers) {
  // Row 0: log-ratios 0.1, 0.3 -> k0 = 0.2, s0 = e^0.2 = 1.221402758, A = +1.
  // Row 1: log-ratio -0.5 (its second token is padding, log_prob 9 there is ignored) -> s1 = e^-0.5 = 0.60653066,
  // A = -1. clip_ratio_low 0.2, clip_ratio_high 0.28: row 0 is inside [0.8, 1.28]: loss -1.221402758 per
  // token; row 1 is below 0.8: max(-A s1, -A 0.8) = max(0.6065, 0.8) = 0.8 (clipped).
  // seq-mean-token-mean: (-1.221402758 + 0.8) / 2 = -0.210701379.
  auto old_lp = torch::zeros({2, 2}, torch::kDouble);
  auto lp = torch::tensor({{0.1, 0.3}, {-0.5, 9.0}}, torch::kDouble).requires_grad_(true);
  auto adv = torch::tensor({{1.0, 1.0}, {-1.0, -1.0}}, torch::kDouble);
  auto mask = torch::tensor({{1.0, 1.0}, {1.0, 0.0}}, torch::kDouble);
  PolicyLossConfig cfg;
  cfg.clip_ratio_low = 0.2;
  cfg.clip_ratio_high = 0.28;
  cfg.loss_mode = PolicyLossMode::kGspo;
  cfg.agg_mode = LossAggMode::kTokenMean;  // not used: GSPO aggregates seq-mean-token-mean like verl
  auto out = policy_loss(old_lp, lp, adv, mask, cfg);
  EXPECT_NEAR(scalar(out.loss), (-std::exp(0.2) + 0.8) / 2.0, 1e-9);
  EXPECT_NEAR(scalar(out.loss), -0.210701379, 1e-9);
  EXPECT_NEAR(scalar(out.clip_frac), 1.0 / 3.0, 1e-9);  // only row 1's one token was clipped
  EXPECT_EQ(scalar(out.clip_frac_lower), 0.0);
  EXPECT_NEAR(scalar(out.approx_kl), -(0.1 + 0.3 - 0.5) / 3.0, 1e-9);
  out.loss.backward();
  // Both tokens of row 0 get the same gradient -A s0 / (2 tokens * 2 rows) = -1.221402758 / 4 = -0.30535069
  // (a token-level ratio would give e^0.1/4 and e^0.3/4); the clipped row and the padding get 0.
  EXPECT_NEAR(lp.grad()[0][0].item<double>(), -std::exp(0.2) / 4.0, 1e-9);
  EXPECT_NEAR(lp.grad()[0][1].item<double>(), -0.30535069, 1e-8);
  EXPECT_EQ(lp.grad()[1][0].item<double>(), 0.0);
  EXPECT_EQ(lp.grad()[1][1].item<double>(), 0.0);
  EXPECT_EQ(cfg.policy_agg_mode(), LossAggMode::kSeqMeanTokenMean);
  EXPECT_EQ(parse_policy_loss_mode(to_string(PolicyLossMode::kGspo)), PolicyLossMode::kGspo);
  EXPECT_THROW(parse_policy_loss_mode("opo"), Error);
}

TEST(AlgoValueLoss, ClippedAgainstOldValues) {
  const Rows v = {{1.0, 0.0, 0.5}, {2.0, 9.0, 9.0}};
  const Rows old = {{0.5, 0.0, 0.5}, {1.0, 0.0, 0.0}};
  const Rows ret = {{1.2, -1.0, 0.0}, {0.0, 0.0, 0.0}};
  const Rows mask = {{1, 1, 1}, {1, 0, 0}};
  const double c = 0.2;
  double sum = 0, clipped = 0;
  for (size_t i = 0; i < v.size(); ++i)
    for (size_t j = 0; j < v[i].size(); ++j) {
      if (mask[i][j] == 0) continue;
      const double vc = std::min(std::max(v[i][j], old[i][j] - c), old[i][j] + c);
      const double l1 = std::pow(v[i][j] - ret[i][j], 2), l2 = std::pow(vc - ret[i][j], 2);
      sum += std::max(l1, l2);
      clipped += l2 > l1;
    }
  auto out = clipped_value_loss(to_tensor(v), to_tensor(old), to_tensor(ret), to_tensor(mask), c);
  EXPECT_NEAR(scalar(out.loss), 0.5 * sum / 4, 1e-5);
  EXPECT_NEAR(scalar(out.clip_frac), clipped / 4, 1e-6);
  EXPECT_GT(clipped, 0);
}

TEST(AlgoEntropy, MatchesMinusSumPLogP) {
  auto logits = torch::tensor({0.3, -1.0, 2.0, 0.0}).reshape({1, 1, 4});
  std::vector<double> z = {0.3, -1.0, 2.0, 0.0};
  double norm = 0;
  for (double x : z) norm += std::exp(x);
  double h = 0;
  for (double x : z) h -= std::exp(x) / norm * std::log(std::exp(x) / norm);
  EXPECT_NEAR(scalar(entropy_from_logits(logits)[0][0]), h, 1e-5);
  auto uniform = torch::zeros({2, 3, 8});
  EXPECT_NEAR(scalar(entropy_loss(uniform, torch::ones({2, 3}))), std::log(8.0), 1e-5);
}

TEST(AlgoKl, EstimatorsByName) {
  const std::vector<double> lp = {-1.0, -2.0, -0.5}, ref = {-1.5, -1.0, -0.5};
  auto a = to_tensor({lp}), b = to_tensor({ref});
  for (const char* name : {"kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"}) {
    auto got = to_rows(kl_penalty(a, b, parse_kl_type(name)))[0];
    for (size_t i = 0; i < lp.size(); ++i) {
      const double d = lp[i] - ref[i];
      const std::string n = name;
      const double want = (n == "kl" || n == "k1")   ? d
                          : n == "abs"               ? std::fabs(d)
                          : (n == "mse" || n == "k2") ? d * d / 2
                                                      : std::exp(ref[i] - lp[i]) - (ref[i] - lp[i]) - 1;
      EXPECT_NEAR(got[i], want, 1e-6) << name << " at " << i;
    }
  }
  EXPECT_THROW(parse_kl_type("k4"), Error);
}

TEST(AlgoKl, ClampBoundsTheEstimate) {
  auto lp = torch::tensor({{-30.0, 0.0}}), ref = torch::tensor({{0.0, -30.0}});
  auto k3 = kl_penalty(lp, ref, KlType::kK3);  // exp(30) without the default clamp
  EXPECT_NEAR(scalar(k3.max()), 10.0, 1e-6);
  EXPECT_GE(scalar(k3.min()), 0.0);
  auto k1 = kl_penalty(lp, ref, KlType::kK1, 5.0);
  EXPECT_NEAR(scalar(k1[0][0]), -5.0, 1e-6);
  EXPECT_NEAR(scalar(k1[0][1]), 5.0, 1e-6);
  EXPECT_NEAR(scalar(kl_penalty(lp, ref, KlType::kK1).abs().max()), 30.0, 1e-6);
}

TEST(AlgoKl, PenaltyInRewardAndAsLoss) {
  const Rows scores = {{0, 0, 1}, {0, 2, 0}};
  const Rows lp = {{-1, -1, -1}, {-2, -1, -7}}, ref = {{-1.5, -1, -0.5}, {-1, -1, 3}};
  const Rows mask = {{1, 1, 1}, {1, 1, 0}};
  const double beta = 0.1;
  Rows want = scores;
  double row_kl[2] = {0, 0};
  for (size_t i = 0; i < 2; ++i) {
    double n = 0;
    for (size_t j = 0; j < 3; ++j) {
      const double k = mask[i][j] * (lp[i][j] - ref[i][j]);
      want[i][j] -= beta * k;
      row_kl[i] += k, n += mask[i][j];
    }
    row_kl[i] /= n;
  }
  auto out = apply_kl_penalty(to_tensor(scores), to_tensor(lp), to_tensor(ref), to_tensor(mask), beta, KlType::kK1);
  EXPECT_ROWS_NEAR(to_rows(out.token_level_rewards), want, 1e-6);
  EXPECT_NEAR(scalar(out.mean_kl), (row_kl[0] + row_kl[1]) / 2, 1e-6);

  auto logp = to_tensor(lp).requires_grad_(true);
  auto loss = kl_loss(logp, to_tensor(ref), to_tensor(mask), KlType::kK2);
  double k2_sum = 0;
  for (size_t i = 0; i < 2; ++i)
    for (size_t j = 0; j < 3; ++j) k2_sum += mask[i][j] * 0.5 * std::pow(lp[i][j] - ref[i][j], 2);
  EXPECT_NEAR(scalar(loss), k2_sum / 5, 1e-5);
  loss.backward();
  EXPECT_NEAR(scalar(logp.grad()[0][0]), (lp[0][0] - ref[0][0]) / 5, 1e-6);
  EXPECT_EQ(scalar(logp.grad()[1][2]), 0.0);
}

TEST(AlgoKlController, FixedAndAdaptive) {
  auto fixed = KlController::from_config("fixed", 0.05, 0.1, 1000);
  fixed.update(10.0, 256);
  EXPECT_DOUBLE_EQ(fixed.value(), 0.05);

  auto adaptive = KlController::adaptive(0.05, 0.1, 1000);
  adaptive.update(0.11, 100);  // error 0.1, inside the clip
  EXPECT_NEAR(adaptive.value(), 0.05 * (1 + 0.1 * 100 / 1000), 1e-12);
  const double before = adaptive.value();
  adaptive.update(1.0, 100);  // error 9 clipped to 0.2
  EXPECT_NEAR(adaptive.value(), before * (1 + 0.2 * 100 / 1000), 1e-12);
  const double high = adaptive.value();
  adaptive.update(0.0, 100);  // error -1 clipped to -0.2
  EXPECT_NEAR(adaptive.value(), high * (1 - 0.2 * 100 / 1000), 1e-12);

  EXPECT_THROW(KlController::from_config("pid", 0.1, 0.1, 1), Error);
  EXPECT_THROW(KlController::adaptive(0.1, 0.0, 1000), Error);
}

TEST(AlgoSafeRlhf, LogLambdaAscent) {
  LagrangeConfig cfg;
  cfg.lambda_init = 0.5;
  cfg.lambda_lr = 0.1;
  cfg.cost_limit = 1.0;
  LagrangeMultiplier lagrange(cfg);
  // Cost above the limit: log(lambda) grows by lr * (cost - limit).
  EXPECT_NEAR(lagrange.update(3.0), 0.5 * std::exp(0.1 * 2.0), 1e-12);
  const double up = lagrange.value();
  EXPECT_NEAR(lagrange.update(-1.0), up * std::exp(0.1 * -2.0), 1e-12);
  // A cost far above the limit for many steps grows lambda geometrically, never to infinity.
  LagrangeMultiplier steady(cfg);
  for (int i = 0; i < 100; ++i) steady.update(2.0);
  EXPECT_NEAR(steady.value(), 0.5 * std::exp(100 * 0.1 * 1.0), 1e-9 * steady.value());
  for (int i = 0; i < 200; ++i) lagrange.update(-1.0);
  EXPECT_GT(lagrange.value(), 0.0);  // shrinks toward but never below zero
  EXPECT_LT(lagrange.value(), 0.01);
}

TEST(AlgoSafeRlhf, ClampedLambdaDelayAndMax) {
  LagrangeConfig cfg;
  cfg.lambda_init = 0.3;
  cfg.lambda_lr = 0.1;
  cfg.cost_limit = 0.0;
  cfg.use_log_lambda = false;
  cfg.lambda_max = 1.0;
  cfg.update_delay_steps = 1;
  LagrangeMultiplier lagrange(cfg);
  EXPECT_DOUBLE_EQ(lagrange.update(5.0), 0.3);  // delayed
  EXPECT_NEAR(lagrange.update(2.0), 0.5, 1e-12);
  EXPECT_DOUBLE_EQ(lagrange.update(100.0), 1.0);  // capped
  EXPECT_DOUBLE_EQ(lagrange.update(-100.0), 0.0);  // projected onto lambda >= 0
}

TEST(AlgoSafeRlhf, CombinedAdvantage) {
  LagrangeConfig cfg;
  cfg.lambda_init = 3.0;
  LagrangeMultiplier lagrange(cfg);
  auto reward_adv = torch::tensor({{1.0, 2.0}, {-1.0, 0.0}});
  auto cost_adv = torch::tensor({{0.5, -1.0}, {1.0, 4.0}});
  auto combined = to_rows(lagrange.combine_advantages(reward_adv, cost_adv));
  const Rows want = {{(1.0 - 1.5) / 4, (2.0 + 3.0) / 4}, {(-1.0 - 3.0) / 4, (0.0 - 12.0) / 4}};
  EXPECT_ROWS_NEAR(combined, want, 1e-6);
  EXPECT_THROW(lagrange.combine_advantages(reward_adv, torch::zeros({2})), Error);
  cfg.lambda_init = 0.0;
  EXPECT_THROW(LagrangeMultiplier{cfg}, Error);  // log parameterisation needs lambda > 0
}

}  // namespace
}  // namespace hybridflow::algo
