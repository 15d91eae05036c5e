// Multi-turn continuous batching read back in chunks (GenerationConfig::readback_interval): sampling and eos
// checks stay on the device between reads, and every interval gives each turn the tokens of interval 1 (and
// the log-probs: bit for bit under the batch-invariant kernels, to float rounding with the default ones), with
// turns ending on an eos id or their limit inside a chunk, one-token turns, tool results resumed by delta
// prefills, conversations arriving late, and groups sharing their prompt's blocks; with fewer reads of the
// device the longer the chunks.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include "hybridflow/engine/turn_batcher.h"
#include "hybridflow/model/batch_invariant.h"
#include "support/tiny_model.h"

namespace hybridflow {
namespace {

constexpr int64_t kConversations = 9;

struct ConversationsRun {
  std::map<std::pair<int64_t, int64_t>, BatchedTurn> turns;  // (conversation, turn) -> the turn
  TurnBatcherStats stats;
  int64_t held_at_end = 0;
};

// Conversation c starts at step call c % 4 and asks (c % 3) + 1 turns; turn k may have 1 + (5c + 3k) % 19 new
// tokens (one-token turns and limits inside chunks), and every turn but the last is followed by a "tool result"
// of (c + k) % 4 + 1 ids. With group_size g, conversations [j*g, (j+1)*g) have the same prompt.
ConversationsRun run_conversations(CausalLM& model, const GenerationConfig& config, int64_t group_size) {
  TurnBatcher batcher(model, config, kConversations, group_size);
  std::vector<std::vector<int64_t>> contexts(kConversations);
  std::vector<int64_t> turns_done(kConversations, 0);
  for (int64_t c = 0; c < kConversations; ++c) {
    const int64_t prompt = c / group_size;
    contexts[static_cast<size_t>(c)] = {5, 10 + prompt, 2};
    for (int64_t k = 0; k < prompt % 4; ++k) contexts[static_cast<size_t>(c)].push_back(20 + k);
  }
  auto limit = [](int64_t c, int64_t k) { return 1 + (5 * c + 3 * k) % 19; };
  ConversationsRun run;
  int64_t finished = 0;
  for (int64_t call = 0; call < 500 && finished < kConversations; ++call) {
    for (int64_t c = 0; c < kConversations; ++c)
      if (c % 4 == call) batcher.submit(c, contexts[static_cast<size_t>(c)], limit(c, 0));
    for (BatchedTurn& t : batcher.step()) {
      const int64_t c = t.conversation;
      const auto at = static_cast<size_t>(c);
      const int64_t k = turns_done[at]++;
      std::vector<int64_t>& context = contexts[at];
      context.insert(context.end(), t.ids.begin(), t.ids.end());
      run.turns.emplace(std::make_pair(c, k), std::move(t));
      if (k + 1 == c % 3 + 1) {
        batcher.release(c);
        ++finished;
        continue;
      }
      for (int64_t i = 0; i < (c + k) % 4 + 1; ++i) context.push_back(30 + (c + i) % 9);
      batcher.submit(c, context, limit(c, k + 1));
    }
  }
  EXPECT_EQ(finished, kConversations) << "the conversations did not all end";
  run.stats = batcher.stats();
  run.held_at_end = batcher.held_blocks();
  return run;
}

class TurnReadbackTest : public ::testing::Test {
 protected:
  void SetUp() override {
    at::set_num_threads(1);
    config.max_new_tokens = 80;  // each conversation's response budget
    config.kv_block_size = 4;
    config.temperature = 1.3;
  }
  CausalLM model = testing::spread_logits_model();
  GenerationConfig config;
};

TEST_F(TurnReadbackTest, EveryIntervalGivesTheTurnsOfIntervalOneWithFewerReads) {
  for (const bool exact : {true, false})
    for (const bool greedy : {false, true})
      for (const int64_t group_size : {1, 3}) {
        SCOPED_TRACE(std::string(exact ? "batch-invariant" : "default") + " kernels, " +
                     (greedy ? "greedy" : "sampling") + ", groups of " + std::to_string(group_size));
        BatchInvariantGuard kernels(exact);
        config.greedy = greedy;
        config.readback_interval = 1;
        // The eos id: the one that most often first appears in a turn past its second token (in a run without
        // one), so that turns end on it at different steps inside chunks.
        config.eos_token_ids = {};
        std::map<int64_t, int64_t> drawn;
        for (const auto& [key, turn] : run_conversations(model, config, group_size).turns)
          for (size_t t = 2; t < turn.ids.size(); ++t)
            if (std::find(turn.ids.begin(), turn.ids.begin() + static_cast<std::ptrdiff_t>(t), turn.ids[t]) ==
                turn.ids.begin() + static_cast<std::ptrdiff_t>(t))
              ++drawn[turn.ids[t]];
        ASSERT_FALSE(drawn.empty());
        const int64_t eos = std::max_element(drawn.begin(), drawn.end(), [](const auto& a, const auto& b) {
                              return a.second < b.second;
                            })->first;
        config.eos_token_ids = {eos};
        const ConversationsRun want = run_conversations(model, config, group_size);
        int64_t eos_ended = 0, one_token = 0;
        for (const auto& [key, turn] : want.turns) {
          eos_ended += turn.ids.size() > 1 && turn.ids.back() == eos ? 1 : 0;
          one_token += turn.ids.size() == 1 ? 1 : 0;
        }
        EXPECT_GE(eos_ended, 2) << "too few turns ended on an eos id to test it inside a chunk";
        EXPECT_GE(one_token, 2);
        EXPECT_GE(want.stats.host_syncs, want.stats.decode_steps);
        int64_t previous_syncs = want.stats.host_syncs;
        for (const int64_t interval : {2, 3, 8}) {
          SCOPED_TRACE("readback_interval " + std::to_string(interval));
          config.readback_interval = interval;
          const ConversationsRun got = run_conversations(model, config, group_size);
          ASSERT_EQ(got.turns.size(), want.turns.size());
          for (const auto& [key, turn] : want.turns) {
            const std::string what =
                "conversation " + std::to_string(key.first) + " turn " + std::to_string(key.second);
            const BatchedTurn& other = got.turns.at(key);
            EXPECT_EQ(other.ids, turn.ids) << what;
            ASSERT_EQ(other.log_probs.size(), turn.log_probs.size()) << what;
            for (size_t t = 0; t < turn.log_probs.size(); ++t) {
              if (exact)
                EXPECT_EQ(other.log_probs[t], turn.log_probs[t]) << what << " token " << t;
              else
                EXPECT_NEAR(other.log_probs[t], turn.log_probs[t], 1e-5) << what << " token " << t;
            }
          }
          EXPECT_EQ(got.stats.turns, want.stats.turns);
          EXPECT_EQ(got.stats.prefill_tokens, want.stats.prefill_tokens);
          EXPECT_EQ(got.stats.reused_tokens, want.stats.reused_tokens);
          EXPECT_EQ(got.stats.shared_prompt_tokens, want.stats.shared_prompt_tokens);
          EXPECT_EQ(got.held_at_end, 0) << "blocks left held after every conversation was released";
          EXPECT_LT(got.stats.host_syncs, previous_syncs);
          previous_syncs = got.stats.host_syncs;
          if (exact && !greedy && group_size == 1)
            std::printf("[ reads   ] interval %2lld: %lld reads of the device over %lld decode steps (%.3f a step); "
                        "interval 1: %lld over %lld (%.3f)\n",
                        static_cast<long long>(interval), static_cast<long long>(got.stats.host_syncs),
                        static_cast<long long>(got.stats.decode_steps),
                        static_cast<double>(got.stats.host_syncs) / static_cast<double>(got.stats.decode_steps),
                        static_cast<long long>(want.stats.host_syncs), static_cast<long long>(want.stats.decode_steps),
                        static_cast<double>(want.stats.host_syncs) / static_cast<double>(want.stats.decode_steps));
        }
      }
}

// A turn that draws its eos id inside a chunk decodes to the chunk's end, and the positions it wrote past its
// end are given back: its blocks hold only its counted tokens, and its next turn's delta prefill starts right
// after its last counted token. A chunk stops where a turn reaches its limit.
TEST_F(TurnReadbackTest, PositionsDecodedPastATurnsEndAreGivenBack) {
  BatchInvariantGuard exact;
  config.greedy = false;  // sampled: fresh ids at every step, unlike greedy's loops
  const std::vector<int64_t> prompt = {5, 11, 2, 20, 21, 22};
  std::vector<int64_t> free_run;
  {
    TurnBatcher b(model, config, 1);
    b.submit(0, prompt, 12);
    for (int step = 0; step < 20 && free_run.empty(); ++step)
      for (const BatchedTurn& t : b.step()) free_run = t.ids;
  }
  ASSERT_EQ(free_run.size(), 12u);
  // The first id drawn at its first place at token 3 or later: the turn ends there, in its first chunk of 8.
  size_t end = 3;
  while (end < free_run.size() && std::find(free_run.begin(), free_run.begin() + static_cast<std::ptrdiff_t>(end),
                                            free_run[end]) != free_run.begin() + static_cast<std::ptrdiff_t>(end))
    ++end;
  ASSERT_LT(end, 9u) << "no fresh id among tokens 3..8 to end the turn on";
  config.eos_token_ids = {free_run[end]};
  config.readback_interval = 8;
  TurnBatcher b(model, config, 1);
  b.submit(0, prompt, 12);
  const std::vector<BatchedTurn> turns = b.step();
  ASSERT_EQ(turns.size(), 1u);
  EXPECT_EQ(turns[0].ids, std::vector<int64_t>(free_run.begin(), free_run.begin() + static_cast<std::ptrdiff_t>(end + 1)));
  EXPECT_EQ(b.stats().decode_steps, 8);  // the whole chunk ran
  EXPECT_EQ(b.stats().host_syncs, 1);
  // The prompt and every counted token but the last (never fed): end + 6 positions in blocks of 4.
  const auto kept = static_cast<int64_t>(prompt.size() + end);
  EXPECT_EQ(b.held_blocks(), (kept + 3) / 4);
  std::vector<int64_t> context = prompt;
  context.insert(context.end(), turns[0].ids.begin(), turns[0].ids.end());
  context.push_back(7);
  b.submit(0, context, 2);
  b.step();
  EXPECT_EQ(b.stats().prefill_tokens - static_cast<int64_t>(prompt.size()), 2);  // the turn's eos and the tool id
  EXPECT_EQ(b.stats().reused_tokens, kept);
  // A chunk stops where a turn reaches its limit: 3 tokens, the first drawn at admission, 2 decode steps.
  TurnBatcher limited(model, config, 1);
  limited.submit(0, prompt, 3);
  EXPECT_EQ(limited.step().size(), 1u);
  EXPECT_EQ(limited.stats().decode_steps, 2);
}

}  // namespace
}  // namespace hybridflow
