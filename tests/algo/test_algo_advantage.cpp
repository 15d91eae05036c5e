#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "algo/algo_test_util.h"
#include "hybridflow/algo/advantage.h"
#include "hybridflow/core/error.h"

namespace hybridflow::algo {
namespace {

using testing::Rows;
using testing::to_rows;
using testing::to_tensor;

// Row 0: full length; row 1: trailing padding; row 2: an interior observation token (mask 0) then padding.
const Rows kMask = {{1, 1, 1, 1}, {1, 1, 0, 0}, {1, 0, 1, 0}};
const Rows kRewards = {{0.1, 0.0, -0.2, 1.0}, {0.0, 0.5, 0.0, 0.0}, {0.3, 0.0, -1.0, 0.0}};
const Rows kValues = {{0.5, 0.4, 0.3, 0.2}, {-0.1, 0.2, 0.0, 0.0}, {0.7, 0.0, 0.1, 0.0}};

// GAE written over the list of valid positions of each row: the masked ones simply do not exist.
void gae_reference(const Rows& r, const Rows& v, const Rows& mask, double gamma, double lam, Rows& adv,
                   Rows& ret) {
  adv = Rows(r.size(), std::vector<double>(r[0].size(), 0));
  ret = adv;
  for (size_t i = 0; i < r.size(); ++i) {
    std::vector<size_t> valid;
    for (size_t j = 0; j < r[i].size(); ++j)
      if (mask[i][j] != 0) valid.push_back(j);
    double next_adv = 0;
    for (size_t k = valid.size(); k-- > 0;) {
      const size_t t = valid[k];
      const double next_v = k + 1 < valid.size() ? v[i][valid[k + 1]] : 0.0;
      const double delta = r[i][t] + gamma * next_v - v[i][t];
      next_adv = delta + gamma * lam * next_adv;
      adv[i][t] = next_adv;
      ret[i][t] = next_adv + v[i][t];
    }
  }
}

AdvantageInput gae_input(const Rows& r, const Rows& v, const Rows& m, double gamma, double lam) {
  AdvantageInput in;
  in.token_level_rewards = to_tensor(r);
  in.values = to_tensor(v);
  in.response_mask = to_tensor(m);
  in.gamma = gamma;
  in.lam = lam;
  return in;
}

TEST(AlgoGae, MatchesPerTokenRecursionAndWhitening) {
  for (auto [gamma, lam] : {std::pair{1.0, 1.0}, std::pair{0.99, 0.95}, std::pair{0.9, 0.0}}) {
    Rows adv, ret;
    gae_reference(kRewards, kValues, kMask, gamma, lam, adv, ret);
    auto out = compute_gae_advantage(gae_input(kRewards, kValues, kMask, gamma, lam));
    EXPECT_ROWS_NEAR(to_rows(out.returns), ret, 1e-5);
    EXPECT_ROWS_NEAR(to_rows(out.advantages), testing::whiten_ref(adv, kMask), 1e-4);
  }
}

TEST(AlgoGae, PaddedPositionsDoNotMatterAndAreZero) {
  Rows r = kRewards, v = kValues;
  for (size_t i = 0; i < r.size(); ++i)
    for (size_t j = 0; j < r[i].size(); ++j)
      if (kMask[i][j] == 0) r[i][j] = 50.0 + j, v[i][j] = -30.0 * (i + 1);
  auto clean = compute_gae_advantage(gae_input(kRewards, kValues, kMask, 0.99, 0.95));
  auto noisy = compute_gae_advantage(gae_input(r, v, kMask, 0.99, 0.95));
  EXPECT_TRUE(torch::allclose(clean.advantages, noisy.advantages, 1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(clean.returns, noisy.returns, 1e-5, 1e-6));
  auto pad = to_tensor(kMask) == 0;
  EXPECT_EQ(noisy.advantages.masked_select(pad).abs().sum().item<double>(), 0.0);
  EXPECT_EQ(noisy.returns.masked_select(pad).abs().sum().item<double>(), 0.0);
}

TEST(AlgoGae, LengthOneResponsesAreOneStepTdError) {
  const Rows r = {{1.0}, {0.0}, {0.5}}, v = {{0.2}, {0.4}, {-0.3}}, m = {{1}, {1}, {1}};
  auto out = compute_gae_advantage(gae_input(r, v, m, 0.99, 0.95));
  const Rows raw = {{0.8}, {-0.4}, {0.8}};  // r - V: no next state
  EXPECT_ROWS_NEAR(to_rows(out.returns), r, 1e-6);
  EXPECT_ROWS_NEAR(to_rows(out.advantages), testing::whiten_ref(raw, m), 1e-4);
}

TEST(AlgoGae, RequiresValues) {
  AdvantageInput in;
  in.token_level_rewards = to_tensor(kRewards);
  in.response_mask = to_tensor(kMask);
  try {
    compute_gae_advantage(in);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("values"), std::string::npos) << e.what();
  }
}

// Sequence rewards at the last valid token; rows 0-2 answer prompt 11, rows 3-5 prompt 4, row 6 is alone.
const Rows kOutcomeMask = {{1, 1, 0}, {1, 1, 1}, {1, 0, 0}, {1, 1, 1}, {1, 1, 0}, {1, 0, 0}, {1, 1, 1}};
const Rows kOutcomeRewards = {{0, 1, 0}, {0, 0, 0}, {0.5, 0, 0}, {0, 0, 2}, {0, 1, 0}, {3, 0, 0}, {0, 0, 0.7}};
const std::vector<int64_t> kIds = {11, 11, 11, 4, 4, 4, 99};

AdvantageInput outcome_input(bool norm = true) {
  AdvantageInput in;
  in.token_level_rewards = to_tensor(kOutcomeRewards);
  in.response_mask = to_tensor(kOutcomeMask);
  in.index = torch::tensor(kIds, torch::kLong);
  in.norm_adv_by_std_in_grpo = norm;
  return in;
}

std::vector<double> row_sums(const Rows& r) {
  std::vector<double> s;
  for (const auto& row : r) {
    double total = 0;
    for (double x : row) total += x;
    s.push_back(total);
  }
  return s;
}

Rows broadcast(const std::vector<double>& per_row, const Rows& mask) {
  Rows out = mask;
  for (size_t i = 0; i < mask.size(); ++i)
    for (size_t j = 0; j < mask[i].size(); ++j) out[i][j] = mask[i][j] * per_row[i];
  return out;
}

TEST(AlgoGrpo, NormalisesWithinEachGroup) {
  const auto s = row_sums(kOutcomeRewards);
  std::map<int64_t, std::vector<double>> members;
  for (size_t i = 0; i < s.size(); ++i) members[kIds[i]].push_back(s[i]);
  std::vector<double> expected_norm, expected_plain;
  for (size_t i = 0; i < s.size(); ++i) {
    const auto& g = members[kIds[i]];
    if (g.size() == 1) {  // verl: mean 0, std 1
      expected_norm.push_back(s[i] / (1 + 1e-6));
      expected_plain.push_back(s[i]);
      continue;
    }
    double mean = 0;
    for (double x : g) mean += x / g.size();
    double var = 0;
    for (double x : g) var += (x - mean) * (x - mean) / (g.size() - 1);
    expected_norm.push_back((s[i] - mean) / (std::sqrt(var) + 1e-6));
    expected_plain.push_back(s[i] - mean);
  }
  auto out = compute_grpo_advantage(outcome_input(true));
  EXPECT_ROWS_NEAR(to_rows(out.advantages), broadcast(expected_norm, kOutcomeMask), 1e-5);
  EXPECT_ROWS_NEAR(to_rows(out.returns), broadcast(expected_norm, kOutcomeMask), 1e-5);
  auto plain = compute_grpo_advantage(outcome_input(false));
  EXPECT_ROWS_NEAR(to_rows(plain.advantages), broadcast(expected_plain, kOutcomeMask), 1e-5);
}

TEST(AlgoGroupEstimators, AllEqualRewardsGiveZeroNotNan) {
  for (const char* name : {"grpo", "rloo"}) {
    AdvantageInput in;
    in.token_level_rewards = torch::zeros({4, 3});
    in.token_level_rewards.index_put_({torch::indexing::Slice(), 2}, 1.0);
    in.response_mask = torch::ones({4, 3});
    in.index = torch::tensor({0, 0, 0, 0}, torch::kLong);
    auto out = compute_advantage(name, in);
    EXPECT_FALSE(out.advantages.isnan().any().item<bool>()) << name;
    EXPECT_EQ(out.advantages.abs().max().item<double>(), 0.0) << name;
  }
}

TEST(AlgoRloo, LeaveOneOutBaseline) {
  const auto s = row_sums(kOutcomeRewards);
  std::vector<double> expected;
  for (size_t i = 0; i < s.size(); ++i) {
    double others = 0;
    int n_others = 0;
    for (size_t k = 0; k < s.size(); ++k)
      if (k != i && kIds[k] == kIds[i]) others += s[k], ++n_others;
    expected.push_back(n_others == 0 ? s[i] : s[i] - others / n_others);
  }
  auto out = compute_rloo_advantage(outcome_input());
  EXPECT_ROWS_NEAR(to_rows(out.advantages), broadcast(expected, kOutcomeMask), 1e-5);
}

TEST(AlgoRemax, RewardMinusGreedyBaseline) {
  AdvantageInput in = outcome_input();
  in.reward_baselines = torch::tensor({0.5, 0.0, 1.0, 1.0, 1.0, 2.0, 0.0});
  auto out = compute_remax_advantage(in);
  // One reward per row at its last valid token: the undiscounted reward-to-go is the score at every valid token.
  const auto s = row_sums(kOutcomeRewards);
  std::vector<double> adv;
  for (size_t i = 0; i < s.size(); ++i) adv.push_back(s[i] - in.reward_baselines[i].item<double>());
  EXPECT_ROWS_NEAR(to_rows(out.returns), broadcast(s, kOutcomeMask), 1e-6);
  EXPECT_ROWS_NEAR(to_rows(out.advantages), broadcast(adv, kOutcomeMask), 1e-6);
  in.reward_baselines = torch::Tensor();
  EXPECT_THROW(compute_remax_advantage(in), Error);
}

TEST(AlgoGrpo, DrGrpoIsScoreMinusGroupMean) {
  // norm_adv_by_std_in_grpo = false (Dr. GRPO): scores {1, 0, 0.5} (mean 0.5) and {2, 0} (mean 1)
  // give A = {0.5, -0.5, 0} and {1, -1}, with no division by the group std.
  AdvantageInput in;
  in.token_level_rewards = to_tensor({{0, 1}, {0, 0}, {0.5, 0}, {0, 2}, {0, 0}});
  in.response_mask = to_tensor({{1, 1}, {1, 1}, {1, 0}, {1, 1}, {1, 1}});
  in.index = torch::tensor({0, 0, 0, 1, 1}, torch::kLong);
  in.norm_adv_by_std_in_grpo = false;
  auto out = compute_grpo_advantage(in);
  EXPECT_ROWS_NEAR(to_rows(out.advantages), (Rows{{0.5, 0.5}, {-0.5, -0.5}, {0, 0}, {1, 1}, {-1, -1}}), 1e-6);
}

TEST(AlgoRemax, ReturnCarriesAcrossAMaskedSpan) {
  // Rewards {1, 5, 2, 3}, mask {1, 0, 1, 1}: the reward-to-go sums the valid rewards behind each token,
  // skipping the masked 5 without restarting: t3 = 3, t2 = 2 + 3 = 5, t0 = 1 + 5 = 6 (t1 is padding: 0).
  // Baseline 2: A = {4, 0, 3, 1}.
  AdvantageInput in;
  in.token_level_rewards = to_tensor({{1, 5, 2, 3}});
  in.response_mask = to_tensor({{1, 0, 1, 1}});
  in.reward_baselines = torch::tensor({2.0});
  auto out = compute_remax_advantage(in);
  EXPECT_ROWS_NEAR(to_rows(out.returns), (Rows{{6, 0, 5, 3}}), 1e-6);
  EXPECT_ROWS_NEAR(to_rows(out.advantages), (Rows{{4, 0, 3, 1}}), 1e-6);
}

TEST(AlgoReinforcePlusPlus, ReturnCarriesAcrossAMaskedSpan) {
  // gamma 0.5, rewards {1, 5, 2, 4}, mask {1, 0, 1, 1}: G3 = 4, G2 = 2 + 0.5 * 4 = 4; the masked t1 is skipped
  // (its reward 5 ignored, the return carried undiscounted), so G0 = 1 + 0.5 * 4 = 3. (verl restarts at t1 and
  // gets G0 = 1.) Returns {3, 0, 4, 4}; whitened over {3, 4, 4}: mean 11/3, unbiased var
  // (4/9 + 1/9 + 1/9) / 2 = 1/3, A = {-2/3, 1/3, 1/3} / sqrt(1/3) = {-1.1547005, 0.5773503, 0.5773503}.
  AdvantageInput in;
  in.token_level_rewards = to_tensor({{1, 5, 2, 4}});
  in.response_mask = to_tensor({{1, 0, 1, 1}});
  in.gamma = 0.5;
  auto out = compute_reinforce_plus_plus_advantage(in);
  EXPECT_ROWS_NEAR(to_rows(out.returns), (Rows{{3, 0, 4, 4}}), 1e-6);
  EXPECT_ROWS_NEAR(to_rows(out.advantages), (Rows{{-1.1547005, 0, 0.5773503, 0.5773503}}), 1e-5);
  // Trailing padding (no gap): the same as verl's restart, G = {1 + 0.5 * 2, 2, 0} = {2, 2, 0}.
  in.token_level_rewards = to_tensor({{1, 2, 7}});
  in.response_mask = to_tensor({{1, 1, 0}});
  EXPECT_ROWS_NEAR(to_rows(compute_reinforce_plus_plus_advantage(in).returns), (Rows{{2, 2, 0}}), 1e-6);
}

TEST(AlgoReinforcePlusPlus, DiscountedReturnToGoWhitened) {
  const double gamma = 0.9;
  Rows ret = kRewards;
  for (size_t i = 0; i < kRewards.size(); ++i) {
    double g = 0;
    for (size_t t = kRewards[i].size(); t-- > 0;) {
      if (kMask[i][t] != 0) g = kRewards[i][t] + gamma * g;  // a masked position is skipped, g carried
      ret[i][t] = kMask[i][t] != 0 ? g : 0.0;
    }
  }
  AdvantageInput in;
  in.token_level_rewards = to_tensor(kRewards);
  in.response_mask = to_tensor(kMask);
  in.gamma = gamma;
  auto out = compute_advantage("reinforce_plus_plus", in);
  EXPECT_ROWS_NEAR(to_rows(out.returns), ret, 1e-6);
  EXPECT_ROWS_NEAR(to_rows(out.advantages), testing::whiten_ref(ret, kMask), 1e-4);
}

// Each row's score minus its group's mean (the lone row 6 keeps its score), as verl computes them.
std::vector<double> minus_group_means(const std::vector<double>& s) {
  std::vector<double> out;
  for (size_t i = 0; i < s.size(); ++i) {
    double sum = 0;
    int n = 0;
    for (size_t k = 0; k < s.size(); ++k)
      if (kIds[k] == kIds[i]) sum += s[k], ++n;
    out.push_back(n == 1 ? s[i] : s[i] - sum / n);
  }
  return out;
}

TEST(AlgoReinforcePlusPlusBaseline, GroupMeanSubtractedThenWhitenedOverTheBatch) {
  const auto centered = broadcast(minus_group_means(row_sums(kOutcomeRewards)), kOutcomeMask);
  auto out = compute_advantage("reinforce_plus_plus_baseline", outcome_input());
  EXPECT_ROWS_NEAR(to_rows(out.advantages), testing::whiten_ref(centered, kOutcomeMask), 1e-5);
  EXPECT_TRUE(torch::equal(out.advantages, out.returns));
  EXPECT_EQ(out.advantages.masked_select(to_tensor(kOutcomeMask) == 0).abs().sum().item<double>(), 0.0);
}

TEST(AlgoGpg, GroupMeanSubtractedAndScaledByTheShareOfNonzeroScores) {
  // Six of the seven scores are nonzero (row 1 scored 0): alpha = 7 / 6.
  auto expected = minus_group_means(row_sums(kOutcomeRewards));
  for (double& a : expected) a *= 7.0 / 6.0;
  auto out = compute_advantage("gpg", outcome_input());
  EXPECT_ROWS_NEAR(to_rows(out.advantages), broadcast(expected, kOutcomeMask), 1e-6);
  EXPECT_TRUE(torch::equal(out.advantages, out.returns));
  // All zero: alpha counts at least one row and every advantage is 0, not NaN.
  AdvantageInput zero = outcome_input();
  zero.token_level_rewards = torch::zeros_like(zero.token_level_rewards);
  EXPECT_EQ(compute_gpg_advantage(zero).advantages.abs().sum().item<double>(), 0.0);
}

TEST(AlgoAdvantageRegistry, BuiltinsCustomAndUnknown) {
  const std::vector<std::string> builtins = {"gae", "grpo", "reinforce_plus_plus", "remax", "rloo",
                                             "reinforce_plus_plus_baseline", "gpg", "optimal_token_baseline",
                                             "tir_optimal_token_baseline"};
  for (const auto& name : builtins) EXPECT_TRUE(has_advantage_estimator(name)) << name;

  auto direct = compute_grpo_advantage(outcome_input());
  auto by_name = compute_advantage("grpo", outcome_input());
  EXPECT_TRUE(torch::equal(direct.advantages, by_name.advantages));

  register_advantage_estimator("constant_test", [](const AdvantageInput& in) {
    auto adv = torch::full_like(in.token_level_rewards, 2.0) * in.response_mask;
    return AdvantageOutput{adv, adv};
  });
  auto names = advantage_estimator_names();
  EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
  EXPECT_NE(std::find(names.begin(), names.end(), "constant_test"), names.end());
  auto custom = compute_advantage("constant_test", outcome_input());
  EXPECT_DOUBLE_EQ(custom.advantages.sum().item<double>(), 2.0 * to_tensor(kOutcomeMask).sum().item<double>());

  try {
    compute_advantage("ppo_magic", outcome_input());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("ppo_magic"), std::string::npos) << msg;
    EXPECT_NE(msg.find("grpo"), std::string::npos) << msg;
  }
}

// The optimal token baseline written per row and position, as verl's loops over each group compute it: the
// reward-to-go G, the path weight W (cumulative 1 - 2 p + sum p^2, times the importance weight squared), and
// the group's baseline at each position weighted by W over the rows valid there; a group of one has none.
TEST(AlgoOptimalTokenBaseline, PerPositionBaselineWeightedByThePathsVariance) {
  torch::manual_seed(5);
  const int64_t b = 7, r = 5;
  const std::vector<int64_t> ids = {3, 3, 3, 8, 8, 8, 1};  // two groups of three, a group of one
  for (const bool with_is : {false, true}) {
    AdvantageInput in;
    in.token_level_rewards = torch::randn({b, r}, torch::kDouble);
    in.response_mask = torch::ones({b, r}, torch::kDouble);
    in.response_mask.index_put_({1, torch::indexing::Slice(3)}, 0.0);  // padding
    in.response_mask.index_put_({4, 1}, 0.0);                            // an observation span
    in.response_mask.index_put_({5, torch::indexing::Slice(2)}, 0.0);
    in.index = torch::tensor(ids, torch::kLong);
    in.old_log_probs = -torch::rand({b, r}, torch::kDouble) * 3;
    in.sum_pi_squared = torch::rand({b, r}, torch::kDouble) * 0.9 + 0.05;
    if (with_is) in.rollout_is_weights = torch::rand({b, r}, torch::kDouble) + 0.5;
    const auto at = [](const torch::Tensor& t, int64_t i, int64_t j) { return t[i][j].item<double>(); };
    std::vector<std::vector<double>> g(b, std::vector<double>(r)), w(b, std::vector<double>(r));
    for (int64_t i = 0; i < b; ++i) {
      double to_go = 0, path = 0;
      for (int64_t t = r; t-- > 0;) {
        to_go += at(in.token_level_rewards, i, t) * at(in.response_mask, i, t);
        g[i][t] = to_go;
      }
      for (int64_t t = 0; t < r; ++t) {
        double step = 1 - 2 * std::exp(at(in.old_log_probs, i, t)) + at(in.sum_pi_squared, i, t);
        if (with_is) step *= at(in.rollout_is_weights, i, t) * at(in.rollout_is_weights, i, t);
        path += step * at(in.response_mask, i, t);
        w[i][t] = path;
      }
    }
    const AdvantageOutput out = compute_advantage("optimal_token_baseline", in);
    for (int64_t i = 0; i < b; ++i)
      for (int64_t t = 0; t < r; ++t) {
        const double m = at(in.response_mask, i, t);
        double num = 0, den = 0;
        int members = 0;
        for (int64_t k = 0; k < b; ++k)
          if (ids[static_cast<size_t>(k)] == ids[static_cast<size_t>(i)]) {
            ++members;
            num += g[k][t] * w[k][t] * at(in.response_mask, k, t);
            den += w[k][t] * at(in.response_mask, k, t);
          }
        const double baseline = members > 1 ? num / (den + 1e-8) : 0.0;
        EXPECT_NEAR(at(out.advantages, i, t), (g[i][t] - baseline) * m, 1e-9) << "row " << i << " position " << t;
        EXPECT_NEAR(at(out.returns, i, t), g[i][t] * m, 1e-12) << "row " << i << " position " << t;
      }
    // The group of one keeps its reward-to-go.
    EXPECT_TRUE(torch::allclose(out.advantages[6], out.returns[6]));
  }
  AdvantageInput missing;
  missing.token_level_rewards = torch::zeros({2, 3});
  missing.response_mask = torch::ones({2, 3});
  missing.index = torch::tensor({0, 0}, torch::kLong);
  try {
    compute_advantage("optimal_token_baseline", missing);
    FAIL() << "sum_pi_squared is required";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("calculate_sum_pi_squared"), std::string::npos) << e.what();
  }
}

// The multi-turn variant as verl's loops compute it: each row's valid tokens packed to the left, the group's
// baseline per packed place, a group's single longest row with baseline 0 past the second longest, and the
// advantages put back where the valid tokens sit.
TEST(AlgoOptimalTokenBaseline, MultiTurnComparesTheKthGeneratedTokensWhereverTheySit) {
  torch::manual_seed(9);
  const int64_t b = 7, r = 8;
  const std::vector<int64_t> ids = {3, 3, 3, 8, 8, 8, 1};
  AdvantageInput in;
  in.token_level_rewards = torch::randn({b, r}, torch::kDouble);
  in.response_mask = (torch::rand({b, r}, torch::kDouble) > 0.3).to(torch::kDouble);  // tool spans anywhere
  in.response_mask[0].fill_(1.0);                                                     // group 3's single longest
  in.response_mask[1].narrow(0, 5, 3).zero_();
  in.response_mask[4].zero_();  // a row without a generated token
  in.index = torch::tensor(ids, torch::kLong);
  in.old_log_probs = -torch::rand({b, r}, torch::kDouble) * 3;
  in.sum_pi_squared = torch::rand({b, r}, torch::kDouble) * 0.9 + 0.05;
  const auto at = [](const torch::Tensor& t, int64_t i, int64_t j) { return t[i][j].item<double>(); };
  // Per row: the valid positions, and G and W at each of them.
  std::vector<std::vector<int64_t>> where(b);
  std::vector<std::vector<double>> g(b), w(b);
  for (int64_t i = 0; i < b; ++i) {
    double path = 0;
    for (int64_t t = 0; t < r; ++t) {
      if (at(in.response_mask, i, t) == 0) continue;
      path += 1 - 2 * std::exp(at(in.old_log_probs, i, t)) + at(in.sum_pi_squared, i, t);
      double to_go = 0;
      for (int64_t k = t; k < r; ++k) to_go += at(in.token_level_rewards, i, k) * at(in.response_mask, i, k);
      where[i].push_back(t);
      g[i].push_back(to_go);
      w[i].push_back(path);
    }
  }
  const AdvantageOutput out = compute_advantage("tir_optimal_token_baseline", in);
  for (int64_t i = 0; i < b; ++i) {
    std::vector<int64_t> group;
    for (int64_t k = 0; k < b; ++k)
      if (ids[static_cast<size_t>(k)] == ids[static_cast<size_t>(i)] && !where[k].empty()) group.push_back(k);
    std::vector<size_t> lengths;
    for (int64_t k : group) lengths.push_back(where[k].size());
    std::sort(lengths.begin(), lengths.end());
    const bool lone_longest = lengths.size() > 1 && lengths.back() > lengths[lengths.size() - 2];
    std::vector<double> want(static_cast<size_t>(r), 0.0);
    for (size_t place = 0; place < where[i].size(); ++place) {
      double num = 0, den = 0;
      for (int64_t k : group)
        if (place < where[k].size()) num += g[k][place] * w[k][place], den += w[k][place];
      double baseline = group.size() > 1 ? num / (den + 1e-8) : 0.0;
      if (lone_longest && where[i].size() == lengths.back() && place >= lengths[lengths.size() - 2]) baseline = 0;
      want[static_cast<size_t>(where[i][place])] = g[i][place] - baseline;
    }
    for (int64_t t = 0; t < r; ++t)
      EXPECT_NEAR(at(out.advantages, i, t), want[static_cast<size_t>(t)], 1e-9) << "row " << i << " position " << t;
  }
  EXPECT_EQ(out.advantages[4].abs().sum().item<double>(), 0.0);
  // Rows 0 and 1 of group 3: row 0 is the single longest, so its places past the second longest keep G.
  ASSERT_GT(where[0].size(), std::max(where[1].size(), where[2].size()));
  const int64_t last = where[0].back();
  EXPECT_NEAR(at(out.advantages, 0, last), g[0].back(), 1e-12);
}

TEST(AlgoGrpo, RejectsMissingOrMisshapenIndex) {
  AdvantageInput in = outcome_input();
  in.index = torch::tensor({1, 2}, torch::kLong);
  EXPECT_THROW(compute_grpo_advantage(in), Error);
  in.index = torch::Tensor();
  EXPECT_THROW(compute_rloo_advantage(in), Error);
}

}  // namespace
}  // namespace hybridflow::algo
