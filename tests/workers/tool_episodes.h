// Scripted episodes for the continuous-batching tests of agentic rollouts: prompts, turns and "tool results"
// of known shapes, over any model with a vocabulary of at least 41 ids.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "hybridflow/parallel/collectives.h"
#include "hybridflow/workers/agent_rollout.h"

namespace hybridflow::testing {

// Episode i of the continuous-batching tests: a prompt of its own, then (i % 3) + 1 assistant turns of at most
// 7 ids, each but the last followed by a "tool result" of (i + turn) % 5 + 1 ids the model did not sample; it
// stops, as run_episode does, when the next tool result would not fit the response budget. With group_size g,
// episodes [k*g, (k+1)*g) have the same prompt (GRPO's n samples of one prompt), of 3 + 5 * (k % 2) ids.
inline EpisodeFunction tool_episodes(std::vector<agent::Trajectory>& out, int64_t budget, int64_t group_size = 1) {
  return [&out, budget, group_size](int64_t i, const agent::TurnSampler& sample) {
    agent::Trajectory& t = out[static_cast<size_t>(i)];
    const int64_t prompt = i / group_size;
    t.prompt_ids = {5, static_cast<int32_t>(10 + prompt), 2};
    const int64_t extra = group_size == 1 ? i % 4 : 5 * (prompt % 2);
    for (int64_t k = 0; k < extra; ++k) t.prompt_ids.push_back(static_cast<int32_t>(20 + k));
    const int turns = static_cast<int>(i % 3) + 1;
    for (int turn = 0; turn < turns; ++turn) {
      const int64_t left = budget - static_cast<int64_t>(t.response_ids.size());
      std::vector<int32_t> context = t.prompt_ids;
      context.insert(context.end(), t.response_ids.begin(), t.response_ids.end());
      const std::vector<int32_t> ids = sample(context, std::min<int64_t>(7, left));
      t.response_ids.insert(t.response_ids.end(), ids.begin(), ids.end());
      t.response_mask.insert(t.response_mask.end(), ids.size(), 1);
      const int64_t tool = (i + turn) % 5 + 1;
      if (turn + 1 == turns || static_cast<int64_t>(t.response_ids.size()) + tool >= budget) break;
      for (int64_t k = 0; k < tool; ++k) {
        t.response_ids.push_back(static_cast<int32_t>(30 + (i + k) % 9));
        t.response_mask.push_back(0);
      }
    }
  };
}

// The sampling of the multi-rank tool-episode tests: 30 response ids per episode, eos id 3, blocks of 4.
inline GenerationConfig tool_turns_config(bool greedy, uint64_t seed) {
  GenerationConfig config;
  config.greedy = greedy;
  config.temperature = 1.0;
  config.seed = seed;
  config.eos_token_ids = {3};
  config.max_new_tokens = 30;
  config.kv_block_size = 4;
  return config;
}

// tool_episodes with a slow "tool": episode 1 waits `tool_time` before its second turn (the others end long
// before), so the thread that drives the turns waits for it with no turn running.
inline EpisodeFunction slow_tool_episodes(std::vector<agent::Trajectory>& out, int64_t budget, int64_t group_size,
                                          std::chrono::milliseconds tool_time) {
  return [fast = tool_episodes(out, budget, group_size), tool_time](int64_t i, const agent::TurnSampler& sample) {
    int turns = 0;
    fast(i, [&](const std::vector<int32_t>& context, int64_t max_new_tokens) {
      if (i == 1 && turns++ == 1) std::this_thread::sleep_for(tool_time);
      return sample(context, max_new_tokens);
    });
  };
}

// An episode's log-probs against the reference's: bit for bit when exact, else within 1e-5.
inline void expect_same_log_probs(const std::vector<float>& got, const std::vector<float>& want, bool exact,
                                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t k = 0; k < want.size(); ++k) {
    if (exact)
      EXPECT_EQ(got[k], want[k]) << what << " token " << k;
    else
      EXPECT_NEAR(got[k], want[k], 1e-5) << what << " token " << k;
  }
}

// Rank 0's episodes (over tensor-parallel ranks or pipeline stages) against one process's: the same prompts,
// tokens and masks, log-probs within 1e-5 (partial sums may add in another order). Returns how many turns
// resumed after a tool result.
inline int64_t expect_episodes_of_one_process(const std::vector<agent::Trajectory>& got,
                                              const std::vector<std::vector<float>>& got_lp,
                                              const std::vector<agent::Trajectory>& want,
                                              const std::vector<std::vector<float>>& want_lp) {
  EXPECT_EQ(got_lp.size(), want_lp.size());
  if (got_lp.size() != want_lp.size() || got.size() != want.size()) return 0;
  int64_t tool_turns = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].prompt_ids, want[i].prompt_ids) << "episode " << i;
    EXPECT_EQ(got[i].response_ids, want[i].response_ids) << "episode " << i;
    EXPECT_EQ(got[i].response_mask, want[i].response_mask) << "episode " << i;
    expect_same_log_probs(got_lp[i], want_lp[i], /*exact=*/false, "episode " + std::to_string(i));
    for (size_t k = 1; k < got[i].response_mask.size(); ++k)
      tool_turns += got[i].response_mask[k] == 1 && got[i].response_mask[k - 1] == 0 ? 1 : 0;
  }
  return tool_turns;
}

// A replica of two ranks (`group`: the tensor-parallel pair or the two stages; `stages` as
// run_in_continuous_turns takes it) runs two groups of three tool episodes, greedy and sampled, as `reference`
// does in one process: rank 0's episodes are its (expect_episodes_of_one_process), both ranks prefill and reuse
// the positions it does, share the same prompt positions and step together (how many steps depends on when the
// episodes' threads asked, so only the ranks' counts agree), and the other rank runs no episode (no tool call);
// reading the tokens back every step and in chunks of 8 (the stages share a chunk's draws on the device).
inline void expect_replica_runs_the_episodes_of_one_process(CausalLM& reference, CausalLM& model, Communicator& group,
                                                            Communicator* stages, uint64_t seed) {
  const int64_t episodes = 6, n = 3;
  for (const int64_t interval : {1, 8})
  for (const bool greedy : {true, false}) {
    SCOPED_TRACE(std::string(greedy ? "greedy" : "sampled") + ", readback_interval " + std::to_string(interval));
    GenerationConfig config = tool_turns_config(greedy, seed);
    config.readback_interval = interval;
    std::vector<agent::Trajectory> want(static_cast<size_t>(episodes)), got(static_cast<size_t>(episodes));
    TurnRoundStats want_stats, got_stats;
    const auto want_lp = run_in_continuous_turns(episodes, tool_episodes(want, config.max_new_tokens, n), reference,
                                                 config, &want_stats, n);
    const auto got_lp = run_in_continuous_turns(episodes, tool_episodes(got, config.max_new_tokens, n), model, config,
                                                &got_stats, n, stages);
    EXPECT_EQ(got_stats.turns, want_stats.turns);
    EXPECT_EQ(got_stats.prefill_tokens, want_stats.prefill_tokens);
    EXPECT_EQ(got_stats.reused_tokens, want_stats.reused_tokens);
    EXPECT_EQ(got_stats.shared_prompt_tokens, want_stats.shared_prompt_tokens);
    EXPECT_GT(got_stats.shared_prompt_tokens, 0);
    EXPECT_EQ(got_stats.keep_alive_steps, 0);
    torch::Tensor steps = torch::tensor({got_stats.decode_steps}, torch::kInt64);
    group.broadcast(steps, 0);
    EXPECT_EQ(got_stats.decode_steps, steps.item<int64_t>());
    if (group.rank() != 0) {
      EXPECT_TRUE(got_lp.empty());
      for (const auto& t : got) EXPECT_TRUE(t.response_ids.empty());
      continue;
    }
    EXPECT_GE(expect_episodes_of_one_process(got, got_lp, want, want_lp), 3)
        << "too few turns resumed after a tool result to compare";
  }
}

// The keep-alive under a replica of two ranks (`group`: the tensor-parallel pair or the two stages, whose
// collectives time out after 3 s): slow_tool_episodes with a 4 s tool and a keep-alive every 200 ms on `model`
// (this rank's part; `stages` as run_in_continuous_turns takes it) run to the end, both ranks count the same
// keep-alive steps, enough to span the tool, and rank 0's episodes are `reference`'s (one process, fast tools).
// Without the keep-alive the other rank's wait in the schedule's broadcast would time out.
inline void expect_keep_alive_through_a_slow_tool(CausalLM& reference, CausalLM& model, Communicator& group,
                                                  Communicator* stages) {
  const int64_t episodes = 4, n = 2;
  const GenerationConfig config = tool_turns_config(/*greedy=*/false, 31);
  std::vector<agent::Trajectory> want(static_cast<size_t>(episodes)), got(static_cast<size_t>(episodes));
  const auto want_lp =
      run_in_continuous_turns(episodes, tool_episodes(want, config.max_new_tokens, n), reference, config, nullptr, n);
  TurnRoundStats stats;
  const auto got_lp =
      run_in_continuous_turns(episodes, slow_tool_episodes(got, config.max_new_tokens, n, std::chrono::seconds(4)),
                              model, config, &stats, n, stages, std::chrono::milliseconds(200));
  EXPECT_GE(stats.keep_alive_steps, 8) << "rank " << group.rank();
  torch::Tensor sent = torch::tensor({stats.keep_alive_steps}, torch::kInt64);
  group.broadcast(sent, 0);
  EXPECT_EQ(stats.keep_alive_steps, sent.item<int64_t>()) << "rank " << group.rank() << " counted other keep-alives";
  if (group.rank() != 0) return;
  expect_episodes_of_one_process(got, got_lp, want, want_lp);
  ASSERT_EQ(got.size(), static_cast<size_t>(episodes));
  const auto& mask = got[1].response_mask;
  EXPECT_TRUE(!mask.empty() && mask.back() == 1 && std::count(mask.begin(), mask.end(), 0) > 0)
      << "episode 1 did not resume after its slow tool";
}

}  // namespace hybridflow::testing
