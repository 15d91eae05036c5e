#include <gtest/gtest.h>
#include <torch/torch.h>

#include "hybridflow/algo/dapo.h"
#include "hybridflow/core/error.h"

namespace hybridflow::algo {
namespace {

TEST(AlgoDapo, OverlongPenaltyOnHandNumbers) {
  // max 20, buffer 4: penalties start after 20 - 4 = 16 tokens, -1 per buffer length (factor 1).
  // 10 -> min(-(10 - 16) / 4, 0) = 0; 16 -> 0; 18 -> -2/4 = -0.5; 20 -> -1; 22 -> -1.5 (verl does not cap).
  auto lengths = torch::tensor({10, 16, 18, 20, 22}, torch::kLong);
  auto p = overlong_penalty(lengths, 20, 4, 1.0);
  auto expected = torch::tensor({0.0f, 0.0f, -0.5f, -1.0f, -1.5f});
  EXPECT_TRUE(torch::allclose(p, expected)) << p;
  // factor 0.5 halves it: 18 -> -0.25.
  EXPECT_NEAR(overlong_penalty(lengths, 20, 4, 0.5)[2].item<double>(), -0.25, 1e-7);
  EXPECT_THROW(overlong_penalty(lengths, 20, 0, 1.0), Error);
  EXPECT_THROW(overlong_penalty(lengths, 20, 21, 1.0), Error);
}

TEST(AlgoDapo, DynamicSamplingKeepsGroupsWithSpreadAndSingletons) {
  // Groups by prompt id, rows interleaved: 7 -> {1, 1, 1} all equal: dropped; 3 -> {0, 1}: kept;
  // 9 -> {0.5} alone: kept (verl keeps std > 0 or one sample); 5 -> {0, 0}: dropped.
  auto index = torch::tensor({7, 3, 7, 9, 3, 7, 5, 5}, torch::kLong);
  auto metric = torch::tensor({1.0, 0.0, 1.0, 0.5, 1.0, 1.0, 0.0, 0.0});
  auto keep = dynamic_sampling_keep(metric, index);
  auto expected = torch::tensor({false, true, false, true, true, false, false, false});
  EXPECT_TRUE(torch::equal(keep, expected)) << keep;
  EXPECT_THROW(dynamic_sampling_keep(metric, index.slice(0, 0, 4)), Error);
}

}  // namespace
}  // namespace hybridflow::algo
