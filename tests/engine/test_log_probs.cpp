#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "hybridflow/core/error.h"
#include "hybridflow/engine/log_probs.h"

namespace hybridflow {
namespace {

// Reference in double precision, one token at a time.
double ref_log_prob(const torch::Tensor& z, int64_t target) {
  auto zd = z.to(torch::kDouble);
  double mx = zd.max().item<double>();
  double sum = 0;
  for (int64_t v = 0; v < zd.size(0); ++v) sum += std::exp(zd[v].item<double>() - mx);
  return zd[target].item<double>() - mx - std::log(sum);
}

double ref_entropy(const torch::Tensor& z) {
  auto zd = z.to(torch::kDouble);
  double h = 0;
  for (int64_t v = 0; v < zd.size(0); ++v) {
    double lp = ref_log_prob(zd, v);
    h -= std::exp(lp) * lp;
  }
  return h;
}

TEST(TokenLogProbs, MatchesPerTokenReference) {
  torch::manual_seed(0);
  auto logits = torch::randn({2, 3, 7}) * 3;
  auto targets = torch::randint(0, 7, {2, 3}, torch::kLong);
  auto out = token_log_probs(logits, targets);
  ASSERT_EQ(out.log_probs.sizes(), (std::vector<int64_t>{2, 3}));
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t t = 0; t < 3; ++t) {
      EXPECT_NEAR(out.log_probs[b][t].item<double>(), ref_log_prob(logits[b][t], targets[b][t].item<int64_t>()),
                  1e-5);
      EXPECT_NEAR(out.entropy[b][t].item<double>(), ref_entropy(logits[b][t]), 1e-5);
    }
  }
}

TEST(TokenLogProbs, EntropyBoundsAndOptionalEntropy) {
  auto uniform = torch::zeros({1, 1, 8});
  auto out = token_log_probs(uniform, torch::zeros({1, 1}, torch::kLong));
  EXPECT_NEAR(out.entropy.item<double>(), std::log(8.0), 1e-6);
  EXPECT_NEAR(out.log_probs.item<double>(), -std::log(8.0), 1e-6);
  auto peaked = torch::zeros({1, 1, 8});
  peaked[0][0][3] = 100;
  auto p = token_log_probs(peaked, torch::full({1, 1}, 3, torch::kLong), /*with_entropy=*/false);
  EXPECT_NEAR(p.log_probs.item<double>(), 0.0, 1e-6);
  EXPECT_FALSE(p.entropy.defined());
}

TEST(TokenLogProbs, GradientFlowsToLogits) {
  auto logits = torch::randn({1, 2, 5}, torch::requires_grad());
  auto out = token_log_probs(logits, torch::tensor({{1, 4}}, torch::kLong));
  out.log_probs.sum().backward();
  ASSERT_TRUE(logits.grad().defined());
  // d log p(y) / dz = onehot(y) - softmax(z): sums to zero per position.
  EXPECT_NEAR(logits.grad().sum(-1).abs().max().item<double>(), 0.0, 1e-6);
}

TEST(TokenLogProbs, RejectsMismatchedShapes) {
  EXPECT_THROW(token_log_probs(torch::zeros({2, 3}), torch::zeros({2, 3}, torch::kLong)), Error);
  EXPECT_THROW(token_log_probs(torch::zeros({2, 3, 4}), torch::zeros({2, 2}, torch::kLong)), Error);
}

TEST(ResponseLogProbs, ScoresEachResponseTokenWithThePreviousPositionsLogits) {
  torch::manual_seed(1);
  const int64_t B = 2, P = 3, R = 4, V = 6;
  auto fixed_logits = torch::randn({B, P + R, V});
  auto ids = torch::randint(0, V, {B, P + R}, torch::kLong);
  auto mask = torch::ones({B, P + R}, torch::kLong);
  int calls = 0;
  LogitsFn forward = [&](const torch::Tensor& in_ids, const torch::Tensor& in_mask) {
    ++calls;
    EXPECT_TRUE(torch::equal(in_ids, ids));
    EXPECT_TRUE(torch::equal(in_mask, mask));
    return fixed_logits;
  };
  const double temperature = 0.7;
  auto out = response_log_probs(forward, ids, mask, R, temperature);
  EXPECT_EQ(calls, 1);
  ASSERT_EQ(out.log_probs.sizes(), (std::vector<int64_t>{B, R}));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t r = 0; r < R; ++r) {
      auto z = fixed_logits[b][P + r - 1] / temperature;
      EXPECT_NEAR(out.log_probs[b][r].item<double>(), ref_log_prob(z, ids[b][P + r].item<int64_t>()), 1e-5);
      EXPECT_NEAR(out.entropy[b][r].item<double>(), ref_entropy(z), 1e-5);
    }
  }
}

TEST(ResponseLogProbs, RejectsBadResponseLength) {
  LogitsFn forward = [](const torch::Tensor& ids, const torch::Tensor&) {
    return torch::zeros({ids.size(0), ids.size(1), 3});
  };
  auto ids = torch::zeros({1, 4}, torch::kLong);
  EXPECT_THROW(response_log_probs(forward, ids, ids, 4), Error);
  EXPECT_THROW(response_log_probs(forward, ids, ids, 0), Error);
  EXPECT_THROW(response_log_probs(forward, ids, ids, 2, 0.0), Error);
}

}  // namespace
}  // namespace hybridflow
