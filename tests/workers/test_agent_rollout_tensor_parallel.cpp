// Multi-turn rollouts under tensor parallelism: rank 0 runs the episodes (each tool call once) and the other
// rank repeats its schedule, and the episodes are those of one process: the same tokens, the log-probs to
// float rounding (the ranks' partial sums add in another order), with GRPO groups sharing their prompts. While
// rank 0 waits for a slow tool with no turn running, its keep-alive steps hold the other rank in the schedule.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "engine/tensor_parallel_fixture.h"
#include "hybridflow/parallel/collectives.h"
#include "hybridflow/workers/agent_rollout.h"
#include "parallel/rank_processes.h"
#include "workers/tool_episodes.h"

namespace hybridflow {
namespace {

using namespace hybridflow::testing;

TEST(AgentRolloutTensorParallel, TwoRanksRunTheEpisodesOfOneProcess) {
  run_ranks(
      2,
      [](int rank, int port) {
        Communicator tp(gloo_world(rank, 2, port));
        CausalLM reference = reference_model(HeadKind::kLanguageModel, 7);
        CausalLM split(tensor_parallel_test_config(), HeadKind::kLanguageModel, TensorParallelGroup(&tp));
        load_full_state(*split, parameters_of(*reference));
        const int64_t episodes = 6, n = 3;
        for (const bool greedy : {true, false}) {
          SCOPED_TRACE(greedy ? "greedy" : "sampled");
          const GenerationConfig config = tool_turns_config(greedy, 23);
          std::vector<agent::Trajectory> want(episodes), got(episodes);
          TurnRoundStats want_stats, got_stats;
          const auto want_lp = run_in_continuous_turns(episodes, tool_episodes(want, config.max_new_tokens, n),
                                                       reference, config, &want_stats, n);
          const auto got_lp = run_in_continuous_turns(episodes, tool_episodes(got, config.max_new_tokens, n), split,
                                                      config, &got_stats, n);
          if (rank != 0) {
            // No episode ran here (no tool call either); the schedule was rank 0's.
            EXPECT_TRUE(got_lp.empty());
            for (const auto& t : got) EXPECT_TRUE(t.response_ids.empty());
            EXPECT_EQ(got_stats.turns, want_stats.turns);
            EXPECT_EQ(got_stats.prefill_tokens, want_stats.prefill_tokens);
            continue;
          }
          EXPECT_GE(expect_episodes_of_one_process(got, got_lp, want, want_lp), 3)
              << "too few turns resumed after a tool result to compare";
          EXPECT_EQ(got_stats.turns, want_stats.turns);
          EXPECT_EQ(got_stats.shared_prompt_tokens, want_stats.shared_prompt_tokens);
          EXPECT_GT(got_stats.shared_prompt_tokens, 0);
        }
      },
      120);
}

// A tool that takes longer than the collectives' timeout: rank 0's keep-alive steps hold rank 1 in the schedule
// (without them its wait in the broadcast would time out), both count them, and the episodes are one process's.
TEST(AgentRolloutTensorParallel, KeepAliveStepsHoldTheOtherRankThroughASlowTool) {
  run_ranks(
      2,
      [](int rank, int port) {
        Communicator tp(gloo_world(rank, 2, port, std::chrono::seconds(3)));
        CausalLM reference = reference_model(HeadKind::kLanguageModel, 11);
        CausalLM split(tensor_parallel_test_config(), HeadKind::kLanguageModel, TensorParallelGroup(&tp));
        load_full_state(*split, parameters_of(*reference));
        expect_keep_alive_through_a_slow_tool(reference, split, tp, nullptr);
      },
      60);
}

}  // namespace
}  // namespace hybridflow
