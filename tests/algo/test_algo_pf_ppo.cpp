#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <set>

#include "hybridflow/algo/pf_ppo.h"
#include "hybridflow/core/error.h"

namespace hybridflow::algo {
namespace {

TEST(AlgoPfPpo, WeightsFollowVerlsThreeMethods) {
  const auto scores = torch::tensor({-1.0, 0.0, 0.5, 2.0, 2.0});
  PfPpoConfig pow;
  pow.weight_pow = 3.0;  // |s|^3 + 1e-8
  const auto w = pf_ppo_weights(scores, pow);
  const double expected_pow[] = {1.0, 0.0, 0.125, 8.0, 8.0};
  for (int i = 0; i < 5; ++i) EXPECT_NEAR(w[i].item<double>(), expected_pow[i] + 1e-8, 1e-15) << i;

  PfPpoConfig max_min;
  max_min.reweight = PfPpoReweight::kMaxMin;  // the highest (2, twice) and the lowest (-1)
  const auto m = pf_ppo_weights(scores, max_min);
  const double expected_max_min[] = {1.0, 0.0, 0.0, 1.0, 1.0};
  for (int i = 0; i < 5; ++i) EXPECT_NEAR(m[i].item<double>(), expected_max_min[i] + 1e-8, 1e-15) << i;

  PfPpoConfig max_random;
  max_random.reweight = PfPpoReweight::kMaxRandom;
  const auto r = pf_ppo_weights(scores, max_random);
  const double expected_max_random[] = {0.1, 0.1, 0.1, 0.4, 0.4};
  for (int i = 0; i < 5; ++i) EXPECT_NEAR(r[i].item<double>(), expected_max_random[i] + 1e-8, 1e-15) << i;

  EXPECT_EQ(parse_pf_ppo_reweight("max_random"), PfPpoReweight::kMaxRandom);
  EXPECT_EQ(to_string(PfPpoReweight::kMaxMin), "max_min");
  EXPECT_THROW(parse_pf_ppo_reweight("softmax"), Error);
}

TEST(AlgoPfPpo, ResampleDrawsInProportionToTheWeights) {
  // 1,000 rows: 10 score 2, 990 score 0. With pow (weights 4 and 1e-8) every draw is one of the ten.
  auto scores = torch::zeros({1000});
  scores.slice(0, 0, 10).fill_(2.0);
  const std::vector<int64_t> drawn = pf_ppo_resample(scores, PfPpoConfig{}, 7);
  ASSERT_EQ(drawn.size(), 1000u);
  std::map<int64_t, int> count;
  for (int64_t row : drawn) ++count[row];
  EXPECT_LT(count.rbegin()->first, 10);
  EXPECT_EQ(count.size(), 10u);  // each of the ten ~100 times: all drawn
  for (const auto& [row, n] : count) EXPECT_GT(n, 50) << row;

  // max_random: the top rows weigh 4x the others. 500 top rows of 1,000 get 0.8 of the draws (+- 4 sigma).
  auto half = torch::zeros({1000});
  half.slice(0, 0, 500).fill_(1.0);
  PfPpoConfig max_random;
  max_random.reweight = PfPpoReweight::kMaxRandom;
  int top = 0;
  for (int64_t row : pf_ppo_resample(half, max_random, 3)) top += row < 500;
  EXPECT_NEAR(top / 1000.0, 0.8, 4 * std::sqrt(0.8 * 0.2 / 1000));

  // All weights 0: uniform (verl's 1e-8 floor), every row reachable.
  const std::vector<int64_t> uniform = pf_ppo_resample(torch::zeros({4}), PfPpoConfig{}, 1);
  for (int64_t row : uniform) EXPECT_TRUE(row >= 0 && row < 4);

  // A function of the seed alone.
  EXPECT_EQ(pf_ppo_resample(half, max_random, 3), pf_ppo_resample(half, max_random, 3));
  EXPECT_NE(pf_ppo_resample(half, max_random, 3), pf_ppo_resample(half, max_random, 4));
  EXPECT_THROW(pf_ppo_resample(torch::tensor({1.0, std::nan("")}), PfPpoConfig{}, 1), Error);
}

}  // namespace
}  // namespace hybridflow::algo
