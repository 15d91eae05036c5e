// CISPO, SAPO, GMPO (geo_mean), Clip-Cov, KL-Cov and DPPO (TV, KL) on one small batch whose expected numbers come from the
// formulas in docs/algorithms.md, evaluated with plain Python loops (math module), not from this code:
//   old = [[-1, -1, -2], [-0.5, -1.5, 0]], log_prob = [[-0.7, -1.1, -2.5], [-0.5, -1.0, 9 (padding)]],
//   A = [[1, 1, 1], [-2, -2, 0]], mask = [[1, 1, 1], [1, 1, 0]]
//   log-ratios d = [[0.3, -0.1, -0.5], [0, 0.5]], r = e^d = [[1.349859, 0.904837, 0.606531], [1, 1.648721]]
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <string>

#include "hybridflow/algo/algo_config.h"
#include "hybridflow/algo/losses.h"
#include "hybridflow/core/error.h"

namespace hybridflow::algo {
namespace {

struct Batch {
  at::Tensor old_lp = torch::tensor({{-1.0, -1.0, -2.0}, {-0.5, -1.5, 0.0}}, torch::kDouble);
  at::Tensor lp = torch::tensor({{-0.7, -1.1, -2.5}, {-0.5, -1.0, 9.0}}, torch::kDouble).requires_grad_(true);
  at::Tensor adv = torch::tensor({{1.0, 1.0, 1.0}, {-2.0, -2.0, 0.0}}, torch::kDouble);
  at::Tensor mask = torch::tensor({{1.0, 1.0, 1.0}, {1.0, 1.0, 0.0}}, torch::kDouble);

  PolicyLossOutput loss(const PolicyLossConfig& cfg, const at::Tensor& weights = {}) {
    return policy_loss(old_lp, lp, adv, mask, cfg, weights);
  }
  double grad(int i, int j) const { return lp.grad()[i][j].item<double>(); }
};

double scalar(const at::Tensor& t) { return t.item<double>(); }

PolicyLossConfig config(PolicyLossMode mode) {
  PolicyLossConfig cfg;
  cfg.loss_mode = mode;
  return cfg;
}

TEST(AlgoCispoLoss, ClippedStopGradientWeightOnHandNumbers) {
  // w = clip(r, 0.8, 1.28) = [[1.28, 0.904837, 0.8], [1, 1.28]]; L = -w A log_prob
  //   = [[0.896, 0.995321, 2.0], [-1.0, -2.56]]. token-mean 0.06626423; seq-mean-token-sum 0.16566058.
  Batch b;
  auto cfg = config(PolicyLossMode::kCispo);
  cfg.clip_ratio_low = 0.2;
  cfg.clip_ratio_high = 0.28;
  auto out = b.loss(cfg);
  EXPECT_NEAR(scalar(out.loss), 0.06626423196791106, 1e-9);
  EXPECT_NEAR(scalar(out.clip_frac), 3.0 / 5.0, 1e-12);  // r = 1.35, 0.61, 1.65 were clipped
  EXPECT_EQ(scalar(out.clip_frac_lower), 0.0);
  EXPECT_NEAR(scalar(out.approx_kl), -(0.3 - 0.1 - 0.5 + 0.0 + 0.5) / 5.0, 1e-12);
  EXPECT_FALSE(out.cov_frac.defined());
  out.loss.backward();
  // d/dlog_prob = -w A / 5 at every valid token, the clipped ones included (the weight is a constant).
  EXPECT_NEAR(b.grad(0, 0), -0.256, 1e-12);
  EXPECT_NEAR(b.grad(0, 1), -0.1809674836071919, 1e-12);
  EXPECT_NEAR(b.grad(0, 2), -0.16, 1e-12);
  EXPECT_NEAR(b.grad(1, 0), 0.4, 1e-12);
  EXPECT_NEAR(b.grad(1, 1), 0.512, 1e-12);
  EXPECT_EQ(b.grad(1, 2), 0.0);  // padding

  Batch seq;
  cfg.agg_mode = LossAggMode::kSeqMeanTokenSum;  // CISPO honours loss_agg_mode
  EXPECT_NEAR(scalar(seq.loss(cfg).loss), 0.16566057991977767, 1e-9);
  EXPECT_EQ(cfg.policy_agg_mode(), LossAggMode::kSeqMeanTokenSum);
}

TEST(AlgoCispoLoss, LowClipAtOrAboveOneMeansNoLowerBound) {
  // clip_ratio_low 10 (the paper's "no lower bound"): only r > 1.28 is clipped; r = 0.606531 keeps its weight.
  Batch b;
  auto cfg = config(PolicyLossMode::kCispo);
  cfg.clip_ratio_low = 10.0;
  cfg.clip_ratio_high = 0.28;
  auto out = b.loss(cfg);
  EXPECT_NEAR(scalar(out.clip_frac), 2.0 / 5.0, 1e-12);
  out.loss.backward();
  EXPECT_NEAR(b.grad(0, 2), -std::exp(-0.5) / 5.0, 1e-12);
}

TEST(AlgoSapoLoss, SigmoidGateOnHandNumbers) {
  // g = sigmoid(tau (r - 1)) 4 / tau, tau = 1 for A > 0 and 1.05 for A <= 0; L = -A g, seq-mean-token-mean:
  // 1.2400083613876824. Its gradient: -A g'(r) r, g'(r) = 4 s (1 - s) with s = sigmoid(tau (r - 1)).
  for (auto agg : {LossAggMode::kTokenMean, LossAggMode::kSeqMeanTokenMean, LossAggMode::kTokenSum}) {
    Batch b;
    auto cfg = config(PolicyLossMode::kSapo);
    cfg.agg_mode = agg;  // not used: SAPO averages per sequence like verl
    auto out = b.loss(cfg);
    EXPECT_NEAR(scalar(out.loss), 1.2400083613876824, 1e-9);
    EXPECT_EQ(scalar(out.clip_frac), 0.0);
    EXPECT_EQ(cfg.policy_agg_mode(), LossAggMode::kSeqMeanTokenMean);
    out.loss.backward();
    const double s = 1.0 / (1.0 + std::exp(-(std::exp(0.3) - 1.0)));
    EXPECT_NEAR(b.grad(0, 0), -4.0 * s * (1 - s) * std::exp(0.3) / 3.0 / 2.0, 1e-12);
    // At r = 1 the gate's slope is exactly 1, as the unclipped surrogate's: -A r / (2 tokens * 2 rows).
    EXPECT_NEAR(b.grad(1, 0), 2.0 / 4.0, 1e-12);
    EXPECT_EQ(b.grad(1, 2), 0.0);
  }
}

TEST(AlgoGeoMeanLoss, GeometricMeanRatioOnHandNumbers) {
  // clip 0.2 both sides. Row 0 (A = +1): d' = min(d, clip(d)) = [0.2, -0.1, -0.5], rho = e^(-0.4/3),
  // L0 = -rho = -0.875173317. Row 1 (A = -2): d' = max(d, clip(d)) = [0, 0.5], rho = e^0.25, L1 = 2.568050817.
  // Loss = mean over rows = 0.8464387504.
  Batch b;
  auto out = b.loss(config(PolicyLossMode::kGeoMean));
  EXPECT_NEAR(scalar(out.loss), 0.8464387504052482, 1e-7);
  EXPECT_NEAR(scalar(out.clip_frac), 2.0 / 5.0, 1e-12);        // d = 0.3 and -0.5 clipped where A > 0
  EXPECT_NEAR(scalar(out.clip_frac_lower), 1.0 / 5.0, 1e-12);  // d = 0.5 clipped where A < 0
  out.loss.backward();
  const double rho0 = std::exp(-0.4 / 3.0), rho1 = std::exp(0.25);
  // dL/dd_t = -a rho / n / 2 rows where d' follows d; 0 where the clip bound took over (row 0's first token).
  EXPECT_NEAR(b.grad(0, 0), 0.0, 1e-12);
  EXPECT_NEAR(b.grad(0, 1), -rho0 / 3.0 / 2.0, 1e-7);
  EXPECT_NEAR(b.grad(0, 2), -rho0 / 3.0 / 2.0, 1e-7);  // below -low, but on the side that lowers the objective
  EXPECT_NEAR(b.grad(1, 1), 2.0 * rho1 / 2.0 / 2.0, 1e-7);
  EXPECT_EQ(b.grad(1, 2), 0.0);
  EXPECT_EQ(config(PolicyLossMode::kGeoMean).policy_agg_mode(), LossAggMode::kSeqMeanTokenMean);
}

TEST(AlgoGeoMeanLoss, RolloutWeightsEnterAsTheirRowGeometricMean) {
  // Row 0 weights 1, 4, 2 -> (8)^(1/3) = 2; row 1 weights 1, 1 (and a garbage 0 at padding) -> 1.
  Batch b;
  auto w = torch::tensor({{1.0, 4.0, 2.0}, {1.0, 1.0, 0.0}}, torch::kDouble);
  auto out = b.loss(config(PolicyLossMode::kGeoMean), w);
  EXPECT_NEAR(scalar(out.loss), (2.0 * -0.875173316514669 + 2.5680508173251653) / 2.0, 1e-7);
}

TEST(AlgoClipCovLoss, DropsTheCovarianceSelectedTokenOnHandNumbers) {
  // Means over valid tokens: A -0.2, log_prob -1.16; cov = [[0.552, 0.072, -1.608], [-1.188, -0.288]].
  // With the band (0.05, 5): row 0's first token qualifies but was clipped (r = 1.35 > 1.2, A > 0), so only
  // the second (cov 0.072) is dropped; max(1, floor(0.0002 * 5)) = 1 token. PPO terms (no dual clip):
  // [[-1.2, (dropped), -0.606531], [2, 3.297443]] -> token-mean 0.6981823763.
  Batch b;
  auto cfg = config(PolicyLossMode::kClipCov);
  cfg.clip_cov_lb = 0.05;
  auto out = b.loss(cfg);
  EXPECT_NEAR(scalar(out.loss), 0.6981823763375246, 1e-9);
  EXPECT_NEAR(scalar(out.clip_frac), 1.0 / 5.0, 1e-12);
  EXPECT_NEAR(scalar(out.cov_frac), 1.0 / 5.0, 1e-12);
  out.loss.backward();
  EXPECT_EQ(b.grad(0, 1), 0.0);                              // dropped: no gradient
  EXPECT_EQ(b.grad(0, 0), 0.0);                              // clipped by the ratio
  EXPECT_NEAR(b.grad(0, 2), -std::exp(-0.5) / 5.0, 1e-12);  // -A r / 5
  EXPECT_NEAR(b.grad(1, 1), 2.0 * std::exp(0.5) / 5.0, 1e-12);

  // verl's default band (1, 5) holds none of these covariances: the loss is PPO's without dual clip.
  Batch none;
  auto plain = none.loss(config(PolicyLossMode::kClipCov));
  EXPECT_EQ(scalar(plain.cov_frac), 0.0);
  EXPECT_NEAR(scalar(plain.loss), (-1.2 - std::exp(-0.1) - std::exp(-0.5) + 2.0 + 2.0 * std::exp(0.5)) / 5.0, 1e-9);
}

TEST(AlgoClipCovLoss, DrawsExactlyTheRatioShareWhenMoreQualify) {
  // 100 rows of 10 tokens, log_prob = A so every cov = (A - mean)^2 > 0; the band (0, 1e9) holds them all and
  // no ratio clips (log_prob = old). ratio 0.05: floor(0.05 * 1000) = 50 dropped, wherever the draw puts them.
  torch::manual_seed(7);
  auto adv = torch::randn({100, 10}, torch::kDouble) + 3.0;
  auto lp = adv.clone().requires_grad_(true);
  auto mask = torch::ones({100, 10}, torch::kDouble);
  auto cfg = config(PolicyLossMode::kClipCov);
  cfg.clip_cov_lb = 0.0;
  cfg.clip_cov_ub = 1e9;
  cfg.clip_cov_ratio = 0.05;
  auto out = policy_loss(adv.detach(), lp, adv, mask, cfg);
  EXPECT_NEAR(scalar(out.cov_frac), 0.05, 1e-12);
  out.loss.backward();
  auto dropped = lp.grad() == 0;
  EXPECT_EQ(dropped.sum().item<int64_t>(), 50);
  // The draw does not depend on torch's global generator: the same batch drops the same tokens.
  torch::randn({1000});
  auto again = lp.detach().clone().requires_grad_(true);
  policy_loss(adv.detach(), again, adv, mask, cfg).loss.backward();
  EXPECT_TRUE(torch::equal(again.grad() == 0, dropped));
}

TEST(AlgoKlCovLoss, PenalisesTheTopCovarianceTokensOnHandNumbers) {
  // kl_cov_ratio 0.4: floor(0.4 * 5) = 2 tokens of largest cov (0.552, 0.072): row 0's first two get
  // + 0.1 |d|. L = [[-1.319859, -0.894837, -0.606531], [2, 3.297443]] -> token-mean 0.4952431312.
  Batch b;
  auto cfg = config(PolicyLossMode::kKlCov);
  cfg.kl_cov_ratio = 0.4;
  auto out = b.loss(cfg);
  EXPECT_NEAR(scalar(out.loss), 0.4952431312151321, 1e-9);
  EXPECT_NEAR(scalar(out.cov_frac), 2.0 / 5.0, 1e-12);
  EXPECT_EQ(scalar(out.clip_frac), 0.0);
  out.loss.backward();
  // (-A r + 0.1 sign(d)) / 5 on the penalised tokens, -A r / 5 elsewhere (no clip anywhere).
  EXPECT_NEAR(b.grad(0, 0), -0.24997176151520062, 1e-12);
  EXPECT_NEAR(b.grad(0, 1), -0.2009674836071919, 1e-12);
  EXPECT_NEAR(b.grad(0, 2), -0.12130613194252668, 1e-12);
  EXPECT_NEAR(b.grad(1, 1), 0.6594885082800512, 1e-12);
  EXPECT_EQ(b.grad(1, 2), 0.0);

  Batch seq;  // KL-Cov honours loss_agg_mode: seq-mean-token-mean = ((-2.821227) / 3 + 5.297443 / 2) / 2
  cfg.agg_mode = LossAggMode::kSeqMeanTokenMean;
  const double row0 = -1.319859 - 0.894837 - std::exp(-0.5), row1 = 2.0 + 2.0 * std::exp(0.5);
  EXPECT_NEAR(scalar(seq.loss(cfg).loss), (row0 / 3.0 + row1 / 2.0) / 2.0, 1e-6);
}

TEST(AlgoDppoLoss, ProbabilityTrustRegionMasksOnHandNumbers) {
  // p - q = e^log_prob - e^old = [[0.128706, -0.035008, -0.053250], [0, 0.144749]];
  // binary KL D = [[0.033548, 0.002715, 0.015993], [0, 0.048620]].
  // TV with low 0.2, high 0.1: row 0's first token (A > 0, p rose by 0.129 > 0.1) is masked; the rest kept.
  // KL with low 0.05, high 0.02: the same token (A > 0, D 0.0335 > 0.02 and p rose) is masked; row 0's third
  // has D 0.016 but p fell, row 1's second D 0.0486 <= 0.05. Both: weight min(r, 1.5) = [., 0.904837, 0.606531],
  // [1, 1.5]; L = -A w log_prob on kept tokens -> token-mean -0.2976704382.
  for (auto mode : {PolicyLossMode::kDppoTv, PolicyLossMode::kDppoKl}) {
    SCOPED_TRACE(to_string(mode));
    Batch b;
    auto cfg = config(mode);
    const bool kl = mode == PolicyLossMode::kDppoKl;
    cfg.clip_ratio_low = kl ? 0.05 : 0.2;
    cfg.clip_ratio_high = kl ? 0.02 : 0.1;
    cfg.clip_ratio_c = 1.5;
    auto out = b.loss(cfg);
    EXPECT_NEAR(scalar(out.loss), -0.2976704381757722, 1e-9);
    EXPECT_NEAR(scalar(out.clip_frac), 1.0 / 5.0, 1e-12);        // the masked token
    EXPECT_NEAR(scalar(out.clip_frac_lower), 1.0 / 5.0, 1e-12);  // r = 1.65 truncated to 1.5, kept
    out.loss.backward();
    EXPECT_EQ(b.grad(0, 0), 0.0);  // masked: no gradient
    EXPECT_NEAR(b.grad(0, 1), -0.1809674836071919, 1e-12);
    EXPECT_NEAR(b.grad(0, 2), -0.12130613194252668, 1e-12);
    EXPECT_NEAR(b.grad(1, 0), 0.4, 1e-12);
    EXPECT_NEAR(b.grad(1, 1), 0.6, 1e-12);  // -A 1.5 / 5: the truncated weight
    EXPECT_EQ(b.grad(1, 2), 0.0);
  }
  // The low side: with A = -1 on row 0, TV masks a fall of p below -low (0.05): row 0's third token (-0.053).
  Batch b;
  b.adv = torch::tensor({{-1.0, -1.0, -1.0}, {-2.0, -2.0, 0.0}}, torch::kDouble);
  auto cfg = config(PolicyLossMode::kDppoTv);
  cfg.clip_ratio_low = 0.05;
  auto out = b.loss(cfg);
  EXPECT_NEAR(scalar(out.clip_frac), 1.0 / 5.0, 1e-12);
  out.loss.backward();
  EXPECT_EQ(b.grad(0, 2), 0.0);
  EXPECT_NEAR(b.grad(0, 1), std::exp(-0.1) / 5.0, 1e-12);
}

TEST(AlgoRecentLosses, PerSequenceLossesRecombineFromMicroBatchesByRows) {
  // SAPO and GMPO average per row whatever loss_agg_mode says; the trainer weighs a micro-batch by its
  // non-empty rows, which must give back the whole batch's loss. Rows 0-1 and 2-3 of a 4-row batch (row 3 empty).
  torch::manual_seed(3);
  auto old_lp = -torch::rand({4, 5}, torch::kDouble);
  auto lp = old_lp + 0.3 * torch::randn({4, 5}, torch::kDouble);
  auto adv = torch::randn({4, 1}, torch::kDouble).expand({4, 5}).contiguous();
  auto mask = torch::tensor({{1, 1, 1, 1, 1}, {1, 1, 0, 0, 0}, {1, 1, 1, 0, 0}, {0, 0, 0, 0, 0}}, torch::kDouble);
  for (auto mode : {PolicyLossMode::kSapo, PolicyLossMode::kGeoMean}) {
    SCOPED_TRACE(to_string(mode));
    auto cfg = config(mode);
    cfg.agg_mode = LossAggMode::kTokenMean;
    const double whole = scalar(policy_loss(old_lp, lp, adv, mask, cfg).loss);
    auto part = [&](int64_t a) {
      return scalar(policy_loss(old_lp.slice(0, a, a + 2), lp.slice(0, a, a + 2), adv.slice(0, a, a + 2),
                                mask.slice(0, a, a + 2), cfg)
                        .loss);
    };
    EXPECT_NEAR((2.0 * part(0) + 1.0 * part(2)) / 3.0, whole, 1e-12);
  }
}

TEST(AlgoRecentLosses, EmptyRowsAndNanPaddingStayFinite) {
  auto old_lp = torch::zeros({2, 2}, torch::kDouble);
  const double nan = std::nan(""), inf = HUGE_VAL;
  auto lp = torch::tensor({{0.1, nan}, {inf, nan}}, torch::kDouble).requires_grad_(true);
  auto adv = torch::tensor({{1.0, nan}, {1.0, 1.0}}, torch::kDouble);
  auto mask = torch::tensor({{1.0, 0.0}, {0.0, 0.0}}, torch::kDouble);
  for (auto mode : {PolicyLossMode::kCispo, PolicyLossMode::kSapo, PolicyLossMode::kGeoMean, PolicyLossMode::kClipCov,
                    PolicyLossMode::kKlCov, PolicyLossMode::kDppoTv, PolicyLossMode::kDppoKl}) {
    SCOPED_TRACE(to_string(mode));
    if (lp.grad().defined()) lp.grad().zero_();
    auto out = policy_loss(old_lp, lp, adv, mask, config(mode));
    EXPECT_TRUE(std::isfinite(scalar(out.loss)));
    out.loss.backward();
    EXPECT_TRUE(torch::isfinite(lp.grad()).all().item<bool>());
    EXPECT_EQ(lp.grad()[1][0].item<double>(), 0.0);
  }
}

// GPG: -A log_prob, token-mean over the 5 valid tokens: (0.7 + 1.1 + 2.5 - 1.0 - 2.0) / 5 = 0.26; the gradient of
// each valid token is -A / 5, the padded one's 0 (its log-prob, 9, is ignored).
TEST(AlgoGpgLoss, PlainPolicyGradientOnHandNumbers) {
  Batch b;
  auto out = b.loss(config(PolicyLossMode::kGpg));
  EXPECT_NEAR(scalar(out.loss), 0.26, 1e-12);
  out.loss.backward();
  for (int j = 0; j < 3; ++j) EXPECT_NEAR(b.grad(0, j), -0.2, 1e-12) << j;
  EXPECT_NEAR(b.grad(1, 0), 0.4, 1e-12);
  EXPECT_NEAR(b.grad(1, 1), 0.4, 1e-12);
  EXPECT_EQ(b.grad(1, 2), 0.0);
  EXPECT_EQ(scalar(out.clip_frac), 0.0);
  EXPECT_NEAR(scalar(out.approx_kl), -0.04, 1e-12);  // mean of old - new: -(0.3 - 0.1 - 0.5 + 0 + 0.5) / 5
  // The rollout's importance weights scale each token's term.
  Batch weighted;
  const auto w = torch::tensor({{2.0, 1.0, 1.0}, {1.0, 0.5, 1.0}}, torch::kDouble);
  EXPECT_NEAR(scalar(weighted.loss(config(PolicyLossMode::kGpg), w).loss), (1.4 + 1.1 + 2.5 - 1.0 - 1.0) / 5, 1e-12);
}

TEST(AlgoRecentLosses, NamesRoundTripAndBadParametersNameTheirKey) {
  for (const char* name :
       {"vanilla", "gspo", "cispo", "sapo", "geo_mean", "clip_cov", "kl_cov", "dppo_tv", "dppo_kl", "gpg"})
    EXPECT_EQ(to_string(parse_policy_loss_mode(name)), name);
  EXPECT_THROW(parse_policy_loss_mode("gmpo"), Error);  // verl registers GMPO as geo_mean

  auto expect_error_naming = [](const std::string& override_, const std::string& key) {
    auto actor = Config::load_from_string(kAlgoDefaultsYaml, "", "test", {override_}).subtree("actor");
    try {
      policy_loss_config(actor);
      ADD_FAILURE() << override_ << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
  };
  expect_error_naming("actor.tau_pos=0", "actor.tau_pos");
  expect_error_naming("actor.tau_neg=-1", "actor.tau_neg");
  expect_error_naming("actor.policy_loss.clip_cov_ratio=0", "actor.policy_loss.clip_cov_ratio");
  expect_error_naming("actor.policy_loss.clip_cov_lb=6", "actor.policy_loss.clip_cov_ub");
  expect_error_naming("actor.policy_loss.kl_cov_ratio=-0.1", "actor.policy_loss.kl_cov_ratio");
  expect_error_naming("actor.policy_loss.ppo_kl_coef=-1", "actor.policy_loss.ppo_kl_coef");

  // The defaults are verl's, and reach the struct.
  auto cfg = policy_loss_config(Config::load_from_string(kAlgoDefaultsYaml, "", "test",
                                                         {"actor.policy_loss.loss_mode=kl_cov",
                                                          "actor.policy_loss.ppo_kl_coef=0.5", "actor.tau_neg=2"})
                                    .subtree("actor"));
  EXPECT_EQ(cfg.loss_mode, PolicyLossMode::kKlCov);
  EXPECT_EQ(cfg.ppo_kl_coef, 0.5);
  EXPECT_EQ(cfg.tau_neg, 2.0);
  EXPECT_EQ(cfg.tau_pos, 1.0);
  EXPECT_EQ(cfg.clip_cov_ratio, 0.0002);
  EXPECT_EQ(cfg.clip_cov_lb, 1.0);
  EXPECT_EQ(cfg.clip_cov_ub, 5.0);
  EXPECT_EQ(cfg.kl_cov_ratio, 0.0002);

  // A loss called with a bad parameter directly fails too.
  Batch b;
  auto bad = config(PolicyLossMode::kSapo);
  bad.tau_pos = 0;
  EXPECT_THROW(b.loss(bad), Error);
}

}  // namespace
}  // namespace hybridflow::algo
