// Micro-batches by token count: the groups respect the budget and hold every row once, trimming keeps the
// columns some row uses, log-probs of trimmed micro-batches equal the padded batch's, and a TrainEngine
// step over token micro-batches equals the step over micro-batches of rows for every weighting.
#include "hybridflow/engine/token_micro_batches.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <set>

#include "hybridflow/core/error.h"
#include "hybridflow/engine/model_log_probs.h"
#include "hybridflow/engine/train_engine.h"
#include "support/error_of.h"
#include "support/tiny_model.h"

namespace hybridflow {
namespace {

constexpr int64_t kPrompt = 6, kResponse = 7, kVocab = 30;

// An RL batch: prompts of `prompt_len[i]` tokens left padded to kPrompt, responses of `response_len[i]`
// tokens right padded to kResponse, plus response-shaped advantages.
DataProto rl_batch(const std::vector<int64_t>& prompt_len, const std::vector<int64_t>& response_len, uint64_t seed) {
  torch::manual_seed(seed);
  const auto rows = static_cast<int64_t>(prompt_len.size());
  auto prompts = torch::randint(3, kVocab, {rows, kPrompt}, torch::kLong);
  auto responses = torch::randint(3, kVocab, {rows, kResponse}, torch::kLong);
  auto prompt_mask = torch::zeros({rows, kPrompt}, torch::kLong);
  auto response_mask = torch::zeros({rows, kResponse}, torch::kLong);
  for (int64_t i = 0; i < rows; ++i) {
    const auto p = prompt_len[static_cast<size_t>(i)], r = response_len[static_cast<size_t>(i)];
    prompt_mask[i].narrow(0, kPrompt - p, p).fill_(1);
    response_mask[i].narrow(0, 0, r).fill_(1);
  }
  prompts.masked_fill_(prompt_mask == 0, 0);
  responses.masked_fill_(response_mask == 0, 0);
  DataProto b;
  b.set_tensor("prompts", prompts);
  b.set_tensor("responses", responses);
  b.set_tensor("response_mask", response_mask);
  b.set_tensor("input_ids", torch::cat({prompts, responses}, 1));
  b.set_tensor("attention_mask", torch::cat({prompt_mask, response_mask}, 1));
  b.set_tensor("advantages", torch::randn({rows, kResponse}) * response_mask.to(torch::kFloat));
  b.set_tensor("score", torch::randn({rows}));  // 1-D: per row, never trimmed
  return b;
}

const std::vector<int64_t> kPromptLen = {6, 2, 4, 3, 6, 1, 5, 2};
const std::vector<int64_t> kResponseLen = {7, 1, 3, 0, 2, 7, 4, 1};

TEST(TokenMicroBatches, RowLengthsReadPromptAndResponseExtents) {
  const RowLengths l = row_lengths(rl_batch(kPromptLen, kResponseLen, 1));
  EXPECT_EQ(l.prompt, kPromptLen);
  // An empty response keeps one column (the log-prob window needs one).
  EXPECT_EQ(l.response, (std::vector<int64_t>{7, 1, 3, 1, 2, 7, 4, 1}));
}

TEST(TokenMicroBatches, GroupsStayWithinTheBudgetAndHoldEveryRowOnce) {
  const RowLengths l = row_lengths(rl_batch(kPromptLen, kResponseLen, 1));
  for (int64_t budget : {13, 20, 40, 1000}) {
    const auto groups = token_budget_groups(l, budget, "budget_key");
    std::set<int64_t> seen;
    for (const auto& g : groups) {
      int64_t prompt = 0, response = 0;
      for (int64_t row : g) {
        EXPECT_TRUE(seen.insert(row).second) << "row " << row << " twice";
        prompt = std::max(prompt, l.prompt[static_cast<size_t>(row)]);
        response = std::max(response, l.response[static_cast<size_t>(row)]);
      }
      EXPECT_LE(static_cast<int64_t>(g.size()) * (prompt + response), budget);
    }
    EXPECT_EQ(seen.size(), kPromptLen.size());
    if (budget == 1000) {
      EXPECT_EQ(groups.size(), 1u);
    }
  }
  // Longest first: the first group starts with a 13-token row.
  const auto groups = token_budget_groups(l, 13, "budget_key");
  EXPECT_EQ(l.prompt[static_cast<size_t>(groups[0][0])] + l.response[static_cast<size_t>(groups[0][0])], 13);
  try {
    token_budget_groups(l, 12, "actor_rollout_ref.actor.ppo_max_token_len_per_gpu");
    FAIL() << "a budget below the longest sequence must fail";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("actor_rollout_ref.actor.ppo_max_token_len_per_gpu"), std::string::npos)
        << e.what();
  }
}

// Expert-parallel ranks run as many micro-batches as the rank of most: asked for more groups than the budget
// forms, the group of most rows is halved until there are that many, each still within the budget and every
// row still in exactly one group; more groups than rows is an error naming the key.
TEST(TokenMicroBatches, AtLeastSplitsTheLargestGroupsUntilThereAreThatMany) {
  const RowLengths l = row_lengths(rl_batch(kPromptLen, kResponseLen, 1));
  const auto formed = token_budget_groups(l, 40, "budget_key");
  ASSERT_LT(formed.size(), 4u);
  size_t formed_most = 0;
  for (const auto& g : formed) formed_most = std::max(formed_most, g.size());
  EXPECT_EQ(token_budget_groups(l, 40, "budget_key", static_cast<int64_t>(formed.size())), formed);
  for (int64_t at_least = static_cast<int64_t>(formed.size()) + 1; at_least <= 8; ++at_least) {
    const auto groups = token_budget_groups(l, 40, "budget_key", at_least);
    ASSERT_EQ(static_cast<int64_t>(groups.size()), at_least);
    std::set<int64_t> seen;
    size_t most = 0;
    for (const auto& g : groups) {
      EXPECT_FALSE(g.empty());
      int64_t prompt = 0, response = 0;
      for (int64_t row : g) {
        EXPECT_TRUE(seen.insert(row).second) << "row " << row << " twice";
        prompt = std::max(prompt, l.prompt[static_cast<size_t>(row)]);
        response = std::max(response, l.response[static_cast<size_t>(row)]);
      }
      EXPECT_LE(static_cast<int64_t>(g.size()) * (prompt + response), 40);
      most = std::max(most, g.size());
    }
    EXPECT_EQ(seen.size(), kPromptLen.size());
    EXPECT_LE(most, formed_most) << "halving made a larger group";
  }
  const DataProto batch = rl_batch(kPromptLen, kResponseLen, 1);
  int64_t formed_count = 0;
  const auto agree_on_5 = [&](int64_t count) {
    formed_count = count;
    return int64_t{5};
  };
  EXPECT_EQ(split_micro_batches(batch, {0, 40, "k", agree_on_5}).size(), 5u);
  EXPECT_EQ(formed_count, static_cast<int64_t>(formed.size())) << "agree_count is given the count the budget formed";
  EXPECT_NE(testing::error_of([&] { token_budget_groups(l, 40, "budget_key", 9); })
                .find("budget_key: 9 micro-batches asked of 8 rows"),
            std::string::npos);
}

TEST(TokenMicroBatches, TrimmingCutsOnlyColumnsNoRowUses) {
  const DataProto batch = rl_batch(kPromptLen, kResponseLen, 2);
  // Rows 1 and 3: prompts of 2 and 3 tokens, responses of 1 and 0 (one column kept).
  const DataProto t = trimmed_rows(batch, torch::tensor({1, 3}, torch::kLong));
  EXPECT_EQ(t.tensor("input_ids").sizes(), (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(t.tensor("attention_mask").sizes(), (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(t.tensor("prompts").sizes(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(t.tensor("responses").sizes(), (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(t.tensor("advantages").sizes(), (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(t.tensor("score").sizes(), (std::vector<int64_t>{2}));
  // Every real token survives, in place.
  EXPECT_EQ(t.tensor("attention_mask").sum().item<int64_t>(), 2 + 1 + 3 + 0);
  EXPECT_TRUE(torch::equal(t.tensor("input_ids")[0], batch.tensor("input_ids")[1].narrow(0, kPrompt - 3, 4)));
  // Router replay's routing [B, L, layers, k] is cut with the sequences.
  DataProto routed = batch;
  const int64_t rows = batch.batch_size(), length = kPrompt + kResponse;
  routed.set_tensor("routed_experts", torch::arange(rows * length * 2 * 3, torch::kLong).view({rows, length, 2, 3}));
  const DataProto r = trimmed_rows(routed, torch::tensor({1, 3}, torch::kLong));
  EXPECT_TRUE(torch::equal(r.tensor("routed_experts")[0],
                           routed.tensor("routed_experts")[1].narrow(0, kPrompt - 3, 4)));
}

TEST(TokenMicroBatches, MergeRestoresBatchOrderAndWidth) {
  const DataProto batch = rl_batch(kPromptLen, kResponseLen, 3);
  const auto micro = split_micro_batches(batch, {0, 20, "k"});
  std::vector<torch::Tensor> parts;
  for (const MicroBatch& m : micro) parts.push_back(m.data.tensor("advantages"));
  EXPECT_TRUE(torch::equal(merge_micro_results(micro, parts, kResponse), batch.tensor("advantages")));
  std::vector<torch::Tensor> scores;
  for (const MicroBatch& m : micro) scores.push_back(m.data.tensor("score"));
  EXPECT_TRUE(torch::equal(merge_micro_results(micro, scores, kResponse), batch.tensor("score")));
}

CausalLM tiny_model() {
  return testing::seeded_model(testing::tiny_model_config({.vocab_size = kVocab,
                                                           .hidden_size = 16,
                                                           .intermediate_size = 32,
                                                           .num_attention_heads = 2,
                                                           .num_key_value_heads = 1,
                                                           .max_position_embeddings = 64}),
                               11);
}

torch::Tensor micro_log_probs(CausalLM& model, const DataProto& m) {
  return response_log_probs(model, m.tensor("input_ids"), m.tensor("attention_mask"), m.tensor("responses").size(1),
                            1.0, false)
      .log_probs;
}

TEST(TokenMicroBatches, TrimmedLogProbsEqualThePaddedBatch) {
  CausalLM model = tiny_model();
  torch::NoGradGuard no_grad;
  const DataProto batch = rl_batch(kPromptLen, kResponseLen, 4);
  const auto mask = batch.tensor("response_mask").to(torch::kFloat);
  const torch::Tensor padded = micro_log_probs(model, batch) * mask;
  for (int64_t budget : {13, 26, 60}) {
    const auto micro = split_micro_batches(batch, {0, budget, "k"});
    std::vector<torch::Tensor> parts;
    for (const MicroBatch& m : micro) parts.push_back(micro_log_probs(model, m.data));
    const torch::Tensor got = merge_micro_results(micro, parts, kResponse) * mask;
    EXPECT_TRUE(torch::allclose(got, padded, 1e-5, 1e-5))
        << "budget " << budget << ": max difference " << (got - padded).abs().max().item<double>();
  }
}

// A policy-gradient-like loss aggregated three ways; the token micro-batches' step must equal the padded
// micro-batches' step for each: the same loss and the same accumulated gradient (left on the parameters
// with clipping off).
TEST(TokenMicroBatches, TrainStepOverTokenMicroBatchesEqualsRowMicroBatches) {
  const DataProto batch = rl_batch(kPromptLen, kResponseLen, 5);
  for (LossWeighting weighting : {LossWeighting::kTokenMean, LossWeighting::kRowMean, LossWeighting::kSum}) {
    std::vector<torch::Tensor> after;
    std::vector<double> losses;
    for (bool by_tokens : {false, true}) {
      CausalLM model = tiny_model();
      OptimizerOptions o;
      o.schedule.lr = 1e-2;
      o.grad_clip = 0;
      TrainEngine engine(model.ptr(), o);
      auto loss_fn = [&](const DataProto& m) {
        const auto mask = m.tensor("response_mask").to(torch::kFloat);
        auto per_token = -micro_log_probs(model, m) * m.tensor("advantages") * mask;
        if (weighting == LossWeighting::kTokenMean) return per_token.sum() / mask.sum();
        if (weighting == LossWeighting::kSum) return per_token.sum();
        const auto rows = mask.sum(1).gt(0).sum().to(torch::kFloat);
        return per_token.sum() / rows;  // seq-mean-token-sum
      };
      StepStats stats;
      if (by_tokens) {
        std::vector<DataProto> micro;
        for (MicroBatch& m : split_micro_batches(batch, {0, 20, "k"})) micro.push_back(m.data);
        ASSERT_GT(micro.size(), 2u);
        stats = engine.train_step(micro, loss_fn, "response_mask", weighting);
      } else {
        stats = engine.train_step(batch, 3, loss_fn, "response_mask", weighting);
      }
      EXPECT_FALSE(stats.skipped);
      losses.push_back(stats.loss);
      std::vector<torch::Tensor> flat;
      for (auto& p : model->parameters()) flat.push_back(p.grad().reshape({-1}));
      after.push_back(torch::cat(flat));
    }
    EXPECT_NEAR(losses[0], losses[1], 1e-6);
    EXPECT_GT(after[0].abs().max().item<double>(), 1e-4);
    EXPECT_TRUE(torch::allclose(after[0], after[1], 1e-5, 1e-7))
        << "weighting " << static_cast<int>(weighting) << ": max difference "
        << (after[0] - after[1]).abs().max().item<double>();
  }
}

}  // namespace
}  // namespace hybridflow
