// Continuous batching of conversation turns: a resumed turn prefills only the ids past its cached prefix and
// gives the tokens and log-probs of generating from the whole context afresh; conversations keep their blocks
// between turns and free them when released; a turn past a conversation's budget is refused.
#include "hybridflow/engine/turn_batcher.h"

#include <gtest/gtest.h>

#include "hybridflow/model/batch_invariant.h"
#include "support/error_of.h"
#include "support/tiny_model.h"
#include "support/two_turns_each.h"

namespace hybridflow {
namespace {

using testing::error_of;
using testing::two_turns_each;

constexpr int64_t kEos = 3;

class TurnBatcherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    at::set_num_threads(1);
    model = testing::spread_logits_model();
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
  // A released conversation that comes back starts afresh: its context is prefilled past the first block its
  // first prefill wrote, which the pool retained (prefix caching).
  const int64_t before = b.stats().prefill_tokens, found_before = b.stats().prefix_cached_tokens;
  b.submit(1, {5, 11, 2, 20, 21, 22, 7}, 2);
  until_turn_of(b, 1);
  EXPECT_EQ(b.stats().prefill_tokens - before, 7 - 4);
  EXPECT_EQ(b.stats().prefix_cached_tokens - found_before, 4);
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

// GRPO's n episodes of one prompt share its KV blocks: the prompt is prefilled once and its full blocks are
// held once. The tokens and log-probs are those of conversations that share nothing (bit for bit under the
// batch-invariant kernels, to float rounding with the default ones), the peak holds (n - 1) * full prompt
// blocks less per group, and every block is freed at the end.
TEST_F(TurnBatcherTest, AGroupsConversationsShareTheirPromptsBlocksAndPrefill) {
  config.greedy = false;
  config.temperature = 1.0;
  config.seed = 11;
  config.eos_token_ids = {};  // every turn runs to its limit, so that the blocks can be counted by hand
  config.enable_prefix_caching = false;  // the groups' own sharing alone (the prompts differ in their first block)
  // Two groups of three: a prompt of 10 ids (2 full blocks of 4 and a partial one, copied on write) and one of
  // 8 (2 full blocks, none partial).
  const std::vector<int64_t> a = {5, 11, 2, 20, 21, 22, 23, 24, 25, 26}, b = {5, 12, 2, 27, 28, 29, 30, 31};
  const std::vector<std::vector<int64_t>> prompts = {a, a, a, b, b, b};
  for (const bool exact : {true, false}) {
    SCOPED_TRACE(exact ? "batch-invariant kernels" : "default kernels");
    BatchInvariantGuard kernels(exact);
    TurnBatcher alone(model, config, 6), shared(model, config, 6, /*group_size=*/3);
    const auto want = two_turns_each(alone, prompts);
    const auto got = two_turns_each(shared, prompts);
    bool some_differ = false;
    for (size_t c = 0; c < prompts.size(); ++c)
      for (size_t k = 0; k < 2; ++k) {
        ASSERT_EQ(got[c][k].ids, want[c][k].ids) << "conversation " << c << " turn " << k;
        ASSERT_EQ(got[c][k].log_probs.size(), want[c][k].log_probs.size());
        for (size_t t = 0; t < want[c][k].log_probs.size(); ++t) {
          if (exact)
            EXPECT_EQ(got[c][k].log_probs[t], want[c][k].log_probs[t]) << "conversation " << c << " turn " << k;
          else
            EXPECT_NEAR(got[c][k].log_probs[t], want[c][k].log_probs[t], 1e-5) << "conversation " << c << " turn " << k;
        }
        some_differ = some_differ || (c % 3 != 0 && got[c][k].ids != got[c - c % 3][k].ids);
      }
    EXPECT_TRUE(some_differ) << "a group's episodes all sampled the same tokens";
    // Each conversation ends holding prompt + 6 decoded + 1 last sampled + 3 tool + 4 decoded positions: 24
    // (prompt a) and 22 (prompt b), 6 blocks of 4 either way; alone, 6 conversations x 6 blocks. Shared, each
    // group's 2 full prompt blocks are held once instead of three times: 2 x (3 - 1) x 2 = 8 blocks fewer.
    EXPECT_EQ(alone.stats().peak_blocks, 36);
    EXPECT_EQ(shared.stats().peak_blocks, 36 - 8);
    EXPECT_EQ(shared.stats().shared_prompt_blocks, 8);
    EXPECT_EQ(alone.stats().shared_prompt_blocks, 0);
    // Prefilled: the prompts once per group instead of once per conversation; the second turns' deltas alike.
    EXPECT_EQ(alone.stats().prefill_tokens, 3 * 10 + 3 * 8 + 6 * 4);
    EXPECT_EQ(shared.stats().prefill_tokens, 10 + 8 + 6 * 4);
    EXPECT_EQ(shared.stats().shared_prompt_tokens, 2 * 10 + 2 * 8);
    for (int64_t c = 0; c < 6; ++c) shared.release(c);
    EXPECT_EQ(shared.held_blocks(), 0);
  }
}

// The turns a step starts are prefilled in as few forwards as max_num_batched_tokens allows, whatever their
// cached prefixes (first contexts of several lengths, deltas past caches of several lengths, and a first
// context arriving beside the deltas): the tokens and log-probs of each prefilled alone (a budget of 1 position),
// bit for bit under the batch-invariant kernels and to float rounding with the default ones.
TEST_F(TurnBatcherTest, TurnsStartedTogetherArePrefilledTogetherAndGenerateWhatTheyWouldAlone) {
  config.greedy = false;
  config.temperature = 1.0;
  config.seed = 3;
  config.eos_token_ids = {};  // every turn runs to its limit: the rounds' turns start in the same steps
  const std::vector<std::vector<int64_t>> prompts = {
      {5, 11, 2, 20}, {6, 12, 2, 21, 22, 23}, {7, 13, 2, 24, 25, 26, 27, 28, 29}, {8, 14, 2, 30, 31}, {9, 15, 40}};
  // Round 1: conversations 0-3 start; round 2: their deltas (3 tool ids after 5 decoded) and 4's first context.
  const auto run = [&](int64_t budget) {
    GenerationConfig c = config;
    c.max_num_batched_tokens = budget;
    TurnBatcher b(model, c, 5);
    std::vector<std::vector<int64_t>> contexts = prompts;
    std::vector<std::vector<BatchedTurn>> turns(prompts.size());
    for (int64_t round = 0; round < 2; ++round) {
      for (int64_t k = 0; k < (round == 0 ? 4 : 5); ++k) b.submit(k, contexts[static_cast<size_t>(k)], 6);
      for (int step = 0; step < 50 && !b.idle(); ++step)
        for (BatchedTurn& t : b.step()) {
          auto& context = contexts[static_cast<size_t>(t.conversation)];
          context.insert(context.end(), t.ids.begin(), t.ids.end());
          for (int64_t id : {int64_t{17}, int64_t{18}, 30 + t.conversation}) context.push_back(id);
          turns[static_cast<size_t>(t.conversation)].push_back(std::move(t));
        }
    }
    return std::pair{std::move(turns), b.stats()};
  };
  for (const bool exact : {true, false}) {
    SCOPED_TRACE(exact ? "batch-invariant kernels" : "default kernels");
    BatchInvariantGuard kernels(exact);
    const auto [alone, alone_stats] = run(1);
    const auto [together, together_stats] = run(8192);
    // Round 2's widest row: conversation 2's cache of 9 + 5 positions and its delta of 1 + 3 ids; the
    // budget of 2 x 18 positions takes its five rows two at a time.
    const auto [pairs, pairs_stats] = run(36);
    EXPECT_EQ(alone_stats.prefill_forwards, 4 + 5);
    EXPECT_EQ(together_stats.prefill_forwards, 1 + 1);
    EXPECT_EQ(pairs_stats.prefill_forwards, 1 + 3);  // round 1: 4 rows x 9 positions
    EXPECT_EQ(together_stats.prefill_tokens, alone_stats.prefill_tokens);
    for (const auto* got : {&together, &pairs})
      for (size_t c = 0; c < prompts.size(); ++c) {
        ASSERT_EQ((*got)[c].size(), c == 4 ? 1u : 2u) << "conversation " << c;
        for (size_t k = 0; k < (*got)[c].size(); ++k) {
          const BatchedTurn& want = alone[c][k];
          ASSERT_EQ((*got)[c][k].ids, want.ids) << "conversation " << c << " turn " << k;
          for (size_t t = 0; t < want.log_probs.size(); ++t) {
            if (exact)
              EXPECT_EQ((*got)[c][k].log_probs[t], want.log_probs[t]) << "conversation " << c << " turn " << k;
            else
              EXPECT_NEAR((*got)[c][k].log_probs[t], want.log_probs[t], 1e-5) << "conversation " << c << " turn " << k;
          }
        }
      }
  }
  config.max_num_batched_tokens = 0;
  EXPECT_NE(error_of([&] { TurnBatcher(model, config, 1); }).find("max_num_batched_tokens"), std::string::npos);
}

// A member released before its first turn gives its share back; one whose first context is not the group's
// prompt is admitted alone and generates what it would have alone; a group is admitted when its first member
// asks, whatever the others do later. Every block is freed at the end.
TEST_F(TurnBatcherTest, AGroupMemberThatLeavesOrDiffersGivesItsShareBack) {
  config.eos_token_ids = {};
  const std::vector<int64_t> prompt = {5, 11, 2, 20, 21, 22}, other = {5, 13, 2, 20};
  TurnBatcher b(model, config, 3, /*group_size=*/3);
  b.submit(0, prompt, 4);
  const BatchedTurn zero = until_turn_of(b, 0);
  // The prompt's 2 shared blocks (the second partly filled), 0's copy of that one and its next block.
  EXPECT_EQ(b.held_blocks(), 4);
  b.release(1);                       // ended before asking for a turn
  b.submit(2, other, 4);
  const BatchedTurn two = until_turn_of(b, 2);
  EXPECT_EQ(b.stats().shared_prompt_tokens, 0);
  TurnBatcher alone(model, config, 3);
  alone.submit(2, other, 4);
  const BatchedTurn want = until_turn_of(alone, 2);
  EXPECT_EQ(two.ids, want.ids);
  EXPECT_EQ(two.log_probs, want.log_probs);
  b.release(0);
  b.release(2);
  EXPECT_EQ(b.held_blocks(), 0);
}

// Prefix caching across prompts: conversations whose first contexts begin with the same whole blocks (a system
// prompt, a tools' schema) start on the blocks the first of them prefilled, alone or as a group's leader. The
// tokens are those of prefix caching off (bit for bit under the batch-invariant kernels, to float rounding
// with the default ones), the positions prefilled fewer by exactly those found, fewer blocks held at the peak,
// and every block freed at the end.
TEST_F(TurnBatcherTest, ContextsThatBeginAlikeStartOnTheFirstOnesPrefixBlocks) {
  config.greedy = false;
  config.temperature = 1.0;
  config.seed = 5;
  config.eos_token_ids = {};
  // 2 whole blocks of 4 in common, then their own ids; c shares only the first block.
  const std::vector<int64_t> a = {5, 9, 2, 20, 21, 22, 23, 24, 33, 34, 35}, b = {5, 9, 2, 20, 21, 22, 23, 24, 36, 37},
                             c = {5, 9, 2, 20, 25, 26, 27, 28, 29};
  const std::vector<std::vector<int64_t>> prompts = {a, a, b, b, c, c};
  struct Case {
    int64_t group_size, found;
  };
  // Alone: the second a finds 2 blocks, both b 2, the first c 1 and the second c 2 (the first c's own second
  // block). In groups of two: the b and c leaders 2 and 1 (their members share the leader's prompt instead).
  for (const Case& k : {Case{1, 8 + 8 + 8 + 4 + 8}, Case{2, 8 + 4}})
    for (const bool exact : {true, false}) {
      SCOPED_TRACE(::testing::Message() << "group_size " << k.group_size << (exact ? ", batch-invariant" : ", default"));
      BatchInvariantGuard kernels(exact);
      GenerationConfig off_config = config;
      off_config.enable_prefix_caching = false;
      TurnBatcher off(model, off_config, 6, k.group_size), on(model, config, 6, k.group_size);
      const auto want = two_turns_each(off, prompts);
      const auto got = two_turns_each(on, prompts);
      for (size_t i = 0; i < prompts.size(); ++i)
        for (size_t t = 0; t < 2; ++t) {
          ASSERT_EQ(got[i][t].ids, want[i][t].ids) << "conversation " << i << " turn " << t;
          for (size_t j = 0; j < want[i][t].log_probs.size(); ++j) {
            if (exact)
              EXPECT_EQ(got[i][t].log_probs[j], want[i][t].log_probs[j]) << "conversation " << i << " turn " << t;
            else
              EXPECT_NEAR(got[i][t].log_probs[j], want[i][t].log_probs[j], 1e-5) << "conversation " << i;
          }
        }
      EXPECT_EQ(off.stats().prefix_cached_tokens, 0);
      EXPECT_EQ(on.stats().prefix_cached_tokens, k.found);
      EXPECT_EQ(off.stats().prefill_tokens - on.stats().prefill_tokens, k.found);
      EXPECT_EQ(off.stats().peak_blocks - on.stats().peak_blocks, k.found / 4);
      for (int64_t i = 0; i < 6; ++i) on.release(i);
      EXPECT_EQ(on.held_blocks(), 0);
    }
}

// A prefix is found while a conversation holds its blocks or the pool retains them after it ended: once they
// are taken again for other ids, a context with that prefix prefills it whole and generates what it would
// have alone.
TEST_F(TurnBatcherTest, APrefixWhoseBlocksWereTakenAgainIsPrefilledAgain) {
  config.eos_token_ids = {};
  config.max_new_tokens = 3;
  config.kv_cache_blocks = 3;  // one conversation of 9 + 3 positions
  const std::vector<int64_t> prompt = {5, 9, 2, 20, 21, 22, 23, 24, 33}, other = {6, 6, 6, 6, 6, 6, 6, 6, 6};
  TurnBatcher b(model, config, 3);
  b.submit(0, prompt, 3);
  until_turn_of(b, 0);
  b.release(0);
  b.submit(1, other, 3);  // needs the whole pool: the retained blocks too
  until_turn_of(b, 1);
  b.release(1);
  b.submit(2, {5, 9, 2, 20, 21, 22, 23, 24, 34}, 3);
  const BatchedTurn two = until_turn_of(b, 2);
  EXPECT_EQ(b.stats().prefix_cached_tokens, 0);
  EXPECT_EQ(b.stats().prefill_tokens, 3 * 9);
  TurnBatcher alone(model, config, 1);
  alone.submit(0, {5, 9, 2, 20, 21, 22, 23, 24, 34}, 3);
  const BatchedTurn want = until_turn_of(alone, 0);
  EXPECT_EQ(two.ids, want.ids);
  EXPECT_EQ(two.log_probs, want.log_probs);
}

}  // namespace
}  // namespace hybridflow
