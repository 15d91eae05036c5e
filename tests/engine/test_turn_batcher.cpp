// Continuous batching of conversation turns: a resumed turn prefills only the ids past its cached prefix and
// gives the tokens and log-probs of generating from the whole context afresh; conversations keep their blocks
// between turns and free them when released; a turn past a conversation's budget is refused.
#include "hybridflow/engine/turn_batcher.h"

#include <gtest/gtest.h>

#include "hybridflow/model/batch_invariant.h"
#include "support/error_of.h"
#include "support/tiny_model.h"

namespace hybridflow {
namespace {

using testing::error_of;

constexpr int64_t kEos = 3;

class TurnBatcherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    at::set_num_threads(1);
    torch::manual_seed(5);
    model = CausalLM(testing::tiny_model_config({.vocab_size = 41, .hidden_size = 32, .intermediate_size = 48}, "qwen2-tiny"));
    torch::NoGradGuard no_grad;
    for (auto& p : model->parameters())
      if (p.dim() == 2) p.mul_(6.0);
    config.greedy = true;
    config.eos_token_ids = {kEos};
    config.max_new_tokens = 40;
    config.kv_block_size = 4;
  }

  // Runs steps until conversation c's turn ends.
  static BatchedTurn until_turn_of(TurnBatcher& b, int64_t c, std::vector<BatchedTurn>* others = nullptr) {
    for (int step = 0; step < 100; ++step)
      for (BatchedTurn& t : b.step()) {
        if (t.conversation == c) return t;
        if (others != nullptr) others->push_back(std::move(t));
      }
    ADD_FAILURE() << "conversation " << c << "'s turn never ended";
    return {};
  }

  CausalLM model{nullptr};
  GenerationConfig config;
};

TEST_F(TurnBatcherTest, AResumedTurnPrefillsOnlyTheDeltaAndMatchesAFreshPrefill) {
  BatchInvariantGuard exact;  // the cached keys came from decode steps; these kernels make them a prefill's
  std::vector<int64_t> context = {5, 11, 2, 20};
  TurnBatcher resumed(model, config, 1);
  resumed.submit(0, context, 5);
  const BatchedTurn first = until_turn_of(resumed, 0);
  ASSERT_FALSE(first.ids.empty());
  context.insert(context.end(), first.ids.begin(), first.ids.end());
  for (int64_t id : {7, 8, 30, 31, 32}) context.push_back(id);  // a "tool result" the model did not sample
  const int64_t prefilled_before = resumed.stats().prefill_tokens;
  resumed.submit(0, context, 6);
  const BatchedTurn second = until_turn_of(resumed, 0);
  // Only the last sampled id (never fed back) and the five appended ones were prefilled.
  EXPECT_EQ(resumed.stats().prefill_tokens - prefilled_before, 6);
  EXPECT_EQ(resumed.stats().reused_tokens, static_cast<int64_t>(context.size()) - 6);

  TurnBatcher fresh(model, config, 1);
  fresh.submit(0, context, 6);
  const BatchedTurn again = until_turn_of(fresh, 0);
  EXPECT_EQ(fresh.stats().prefill_tokens, static_cast<int64_t>(context.size()));
  EXPECT_EQ(second.ids, again.ids);
  EXPECT_EQ(second.log_probs, again.log_probs);
}

TEST_F(TurnBatcherTest, ConversationsKeepTheirBlocksBetweenTurnsAndFreeThemWhenReleased) {
  TurnBatcher b(model, config, 3);
  for (int64_t c = 0; c < 3; ++c) b.submit(c, {5, static_cast<int64_t>(10 + c), 2, 20, 21, 22}, 4);
  std::vector<BatchedTurn> done;
  while (done.size() < 3)
    for (BatchedTurn& t : b.step()) done.push_back(std::move(t));
  EXPECT_TRUE(b.idle());
  const int64_t held = b.held_blocks();
  EXPECT_GE(held, 3 * 2);  // each holds at least its context's 2 blocks of 4 while it waits for a tool
  b.release(1);
  EXPECT_LT(b.held_blocks(), held);
  // A released conversation that comes back starts afresh (its whole context is prefilled).
  const int64_t before = b.stats().prefill_tokens;
  b.submit(1, {5, 11, 2, 20, 21, 22, 7}, 2);
  until_turn_of(b, 1);
  EXPECT_EQ(b.stats().prefill_tokens - before, 7);
  for (int64_t c = 0; c < 3; ++c) b.release(c);
  EXPECT_EQ(b.held_blocks(), 0);
  EXPECT_GT(b.stats().peak_blocks, 0);
}

TEST_F(TurnBatcherTest, ConversationsTurnsInterleaveInsteadOfWaitingForTheSlowest) {
  config.eos_token_ids = {};  // turns end at their token limits only
  TurnBatcher b(model, config, 2);
  std::vector<int64_t> context = {5, 10, 2};
  b.submit(0, context, 2);
  b.submit(1, {5, 12, 2}, 30);
  const BatchedTurn first = until_turn_of(b, 0);
  EXPECT_EQ(first.ids.size(), 2u);
  EXPECT_EQ(b.running_turns(), 1);  // conversation 1 goes on while 0 "runs its tool"
  context.insert(context.end(), first.ids.begin(), first.ids.end());
  for (int64_t id : {7, 8, 9}) context.push_back(id);
  b.submit(0, context, 3);
  std::vector<BatchedTurn> others;
  const BatchedTurn second = until_turn_of(b, 0, &others);
  EXPECT_EQ(second.ids.size(), 3u);
  EXPECT_TRUE(others.empty()) << "conversation 1's long turn ended before 0's second turn";
  EXPECT_EQ(b.stats().turns, 2);
  EXPECT_EQ(b.stats().largest_step, 2);
  const BatchedTurn long_turn = until_turn_of(b, 1);
  EXPECT_EQ(long_turn.ids.size(), 30u);
  // 0's second turn rejoined after 2 steps and took 3 more; 1's 30 tokens took 29 decode steps in all.
  EXPECT_EQ(b.stats().decode_steps, 29);
}

TEST_F(TurnBatcherTest, ATurnPastTheConversationsBudgetIsRefused) {
  config.max_new_tokens = 8;
  TurnBatcher b(model, config, 1);
  b.submit(0, {5, 10, 2}, 8);  // 3 + 8 positions: its budget
  const BatchedTurn t = until_turn_of(b, 0);
  std::vector<int64_t> context = {5, 10, 2};
  context.insert(context.end(), t.ids.begin(), t.ids.end());
  context.push_back(7);
  const int64_t left = 3 + 8 - static_cast<int64_t>(context.size());
  const std::string message = error_of([&] { b.submit(0, context, left + 2); });
  EXPECT_NE(message.find("response budget"), std::string::npos) << message;
  if (left >= 1) {
    EXPECT_NO_THROW(b.submit(0, context, left + 1));
  }
  TurnBatcher other(model, config, 1);
  EXPECT_NE(error_of([&] { other.submit(0, {5, 99}, 1); }).find("vocabulary"), std::string::npos);
}

TEST_F(TurnBatcherTest, AFixedPoolMakesAConversationWaitForBlocks) {
  config.kv_cache_blocks = 4;  // one conversation of up to 3 + 8 positions at a time (3 blocks of 4)
  config.max_new_tokens = 8;
  TurnBatcher b(model, config, 2);
  b.submit(0, {5, 10, 2}, 3);
  b.submit(1, {5, 11, 2}, 3);
  const BatchedTurn zero = until_turn_of(b, 0);
  EXPECT_EQ(zero.conversation, 0);
  EXPECT_FALSE(b.idle());  // conversation 1 waits: 0 holds its blocks until released
  EXPECT_EQ(b.running_turns(), 0);
  b.release(0);
  const BatchedTurn one = until_turn_of(b, 1);
  EXPECT_FALSE(one.ids.empty());
  b.release(1);
  EXPECT_EQ(b.held_blocks(), 0);
  EXPECT_EQ(b.stats().pool_blocks, 4);

  config.kv_cache_blocks = 2;
  TurnBatcher small(model, config, 1);
  small.submit(0, {5, 10, 2}, 3);
  EXPECT_NE(error_of([&] { small.step(); }).find("kv_cache_blocks"), std::string::npos);
}

}  // namespace
}  // namespace hybridflow
