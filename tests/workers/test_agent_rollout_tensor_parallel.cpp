// Multi-turn rollouts under tensor parallelism: rank 0 runs the episodes (each tool call once) and the other
// rank repeats its schedule, and the episodes are those of one process: the same tokens, the log-probs to
// float rounding (the ranks' partial sums add in another order), with GRPO groups sharing their prompts.
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
          GenerationConfig config;
          config.greedy = greedy;
          config.temperature = 1.0;
          config.seed = 23;
          config.eos_token_ids = {3};
          config.max_new_tokens = 30;
          config.kv_block_size = 4;
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
          ASSERT_EQ(got_lp.size(), want_lp.size());
          int64_t tool_turns = 0;
          for (size_t i = 0; i < want.size(); ++i) {
            EXPECT_EQ(got[i].response_ids, want[i].response_ids) << "episode " << i;
            EXPECT_EQ(got[i].response_mask, want[i].response_mask) << "episode " << i;
            expect_same_log_probs(got_lp[i], want_lp[i], /*exact=*/false, "episode " + std::to_string(i));
            for (size_t k = 1; k < got[i].response_mask.size(); ++k)
              tool_turns += got[i].response_mask[k] == 1 && got[i].response_mask[k - 1] == 0 ? 1 : 0;
          }
          EXPECT_GE(tool_turns, 3) << "too few turns resumed after a tool result to compare";
          EXPECT_EQ(got_stats.turns, want_stats.turns);
          EXPECT_EQ(got_stats.shared_prompt_tokens, want_stats.shared_prompt_tokens);
          EXPECT_GT(got_stats.shared_prompt_tokens, 0);
        }
      },
      120);
}

}  // namespace
}  // namespace hybridflow
