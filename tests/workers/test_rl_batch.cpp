// The RL batch layout helpers: left-padded prompts, fixed-width responses, scores at the last token.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "hybridflow/core/error.h"
#include "hybridflow/workers/data_parallel.h"
#include "hybridflow/workers/rl_batch.h"

using namespace hybridflow;

TEST(RlBatch, PromptsAreLeftPaddedAndRoundTrip) {
  std::vector<std::vector<int64_t>> prompts = {{5, 6, 7}, {8}};
  DataProto b = make_prompt_batch(prompts, 0);
  EXPECT_TRUE(torch::equal(b.tensor("input_ids"), torch::tensor({5, 6, 7, 0, 0, 8}, torch::kLong).view({2, 3})));
  EXPECT_TRUE(torch::equal(b.tensor("attention_mask"), torch::tensor({1, 1, 1, 0, 0, 1}, torch::kLong).view({2, 3})));
  EXPECT_EQ(prompt_token_lists(b), prompts);

  DataProto f;
  f.set_field("prompt_ids", {nlohmann::json(prompts[0]), nlohmann::json(prompts[1])});
  EXPECT_EQ(prompt_token_lists(f), prompts);
  EXPECT_THROW(make_prompt_batch({{1}, {}}, 0), Error);
}

TEST(RlBatch, RolloutBatchPadsResponsesToFixedLength) {
  GenerationOutput g;
  g.prompts = torch::tensor({0, 4, 5, 6}, torch::kLong).view({2, 2});
  g.prompt_mask = torch::tensor({0, 1, 1, 1}, torch::kLong).view({2, 2});
  g.responses = torch::tensor({7, 2, 8, 0}, torch::kLong).view({2, 2});
  g.response_mask = torch::tensor({1, 1, 1, 0}, torch::kLong).view({2, 2});
  g.log_probs = torch::tensor({-0.5f, -1.f, -2.f, 0.f}).view({2, 2});
  DataProto b = rollout_batch(g, 4, 0);
  EXPECT_EQ(b.tensor("responses").sizes(), (std::vector<int64_t>{2, 4}));
  EXPECT_TRUE(torch::equal(b.tensor("response_mask"), torch::tensor({1, 1, 0, 0, 1, 0, 0, 0}, torch::kLong).view({2, 4})));
  EXPECT_TRUE(torch::equal(b.tensor("input_ids")[1], torch::tensor({5, 6, 8, 0, 0, 0}, torch::kLong)));
  EXPECT_TRUE(torch::equal(b.tensor("attention_mask")[0], torch::tensor({0, 1, 1, 1, 0, 0}, torch::kLong)));
  EXPECT_FLOAT_EQ(b.tensor("rollout_log_probs")[1][0].item<float>(), -2.f);
  EXPECT_THROW(rollout_batch(g, 1, 0), Error);
}

// Router replay's routed_experts follow input_ids: -1 past the generated tokens and in added prompt padding.
TEST(RlBatch, TheRolloutsRoutingFollowsTheSequences) {
  GenerationOutput g;
  g.prompts = torch::tensor({0, 4, 5, 6}, torch::kLong).view({2, 2});
  g.prompt_mask = torch::tensor({0, 1, 1, 1}, torch::kLong).view({2, 2});
  g.responses = torch::tensor({7, 2, 8, 0}, torch::kLong).view({2, 2});
  g.response_mask = torch::tensor({1, 1, 1, 0}, torch::kLong).view({2, 2});
  g.log_probs = torch::zeros({2, 2});
  // [rows, P + R, layers = 1, k = 2]
  g.routed_experts = torch::arange(16, torch::kLong).view({2, 4, 1, 2});
  DataProto b = rollout_batch(g, 3, 0);
  const auto& routed = b.tensor("routed_experts");
  ASSERT_EQ(routed.sizes(), (std::vector<int64_t>{2, 5, 1, 2}));
  EXPECT_TRUE(torch::equal(routed.narrow(1, 0, 4), g.routed_experts));
  EXPECT_TRUE(routed.select(1, 4).eq(-1).all().item<bool>());
  DataProto wider = left_pad_prompts(b, 4, 0);
  ASSERT_EQ(wider.tensor("routed_experts").sizes(), (std::vector<int64_t>{2, 7, 1, 2}));
  EXPECT_TRUE(wider.tensor("routed_experts").narrow(1, 0, 2).eq(-1).all().item<bool>());
  EXPECT_TRUE(torch::equal(wider.tensor("routed_experts").narrow(1, 2, 5), routed));
}

TEST(RlBatch, ScoresSitAtTheLastValidResponseToken) {
  auto mask = torch::tensor({1, 1, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0}, torch::kLong).view({3, 4});
  auto out = scores_at_last_token(torch::tensor({2.f, -1.f, 5.f}), mask);
  auto expected = torch::zeros({3, 4});
  expected[0][2] = 2.f;
  expected[1][0] = -1.f;  // a row with no response tokens gets nothing
  EXPECT_TRUE(torch::equal(out, expected));
  EXPECT_TRUE(torch::equal(out.sum(1), torch::tensor({2.f, -1.f, 0.f})));
  EXPECT_THROW(scores_at_last_token(torch::ones({2}), mask), Error);
}
