// Multi-turn rollouts over two pipeline stages: stage 0 runs the episodes (each tool call once) and stage 1
// repeats its schedule, each prefill and decode step handing its activations from stage to stage and the last
// stage drawing the tokens; the episodes are those of one process (the same tokens and masks, the log-probs to
// 1e-5), with GRPO groups sharing their prompts. While stage 0 waits for a slow tool with no turn running, its
// keep-alive steps hold stage 1 inside the collectives' timeout.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "engine/tensor_parallel_fixture.h"
#include "hybridflow/core/error.h"
#include "hybridflow/parallel/collectives.h"
#include "hybridflow/workers/agent_rollout.h"
#include "parallel/rank_processes.h"
#include "workers/tool_episodes.h"

namespace hybridflow {
namespace {

using namespace hybridflow::testing;

// Stage `rank` of two of the reference model made with `seed`.
CausalLM two_stage_model(int rank, uint64_t seed) {
  CausalLM reference = reference_model(HeadKind::kLanguageModel, seed);
  CausalLM stage(tensor_parallel_test_config(), HeadKind::kLanguageModel, TensorParallelGroup{},
                 PipelineStage{rank, 2});
  load_full_state(*stage, parameters_of(*reference));
  return stage;
}

TEST(AgentRolloutPipelineParallel, TwoStagesRunTheEpisodesOfOneProcess) {
  run_ranks(
      2,
      [](int rank, int port) {
        Communicator stages(gloo_world(rank, 2, port));
        CausalLM reference = reference_model(HeadKind::kLanguageModel, 7);
        CausalLM stage = two_stage_model(rank, 7);
        const int64_t episodes = 6, n = 3;
        for (const bool greedy : {true, false}) {
          SCOPED_TRACE(greedy ? "greedy" : "sampled");
          const GenerationConfig config = tool_turns_config(greedy, 29);
          std::vector<agent::Trajectory> want(episodes), got(episodes);
          TurnRoundStats want_stats, got_stats;
          const auto want_lp = run_in_continuous_turns(episodes, tool_episodes(want, config.max_new_tokens, n),
                                                       reference, config, &want_stats, n);
          const auto got_lp = run_in_continuous_turns(episodes, tool_episodes(got, config.max_new_tokens, n), stage,
                                                      config, &got_stats, n, &stages);
          // Every stage prefilled what one process's batcher does, and the stages stepped together (how many
          // steps depends on when the episodes' threads asked, so only the stages' counts agree).
          EXPECT_EQ(got_stats.turns, want_stats.turns);
          EXPECT_EQ(got_stats.prefill_tokens, want_stats.prefill_tokens);
          EXPECT_EQ(got_stats.reused_tokens, want_stats.reused_tokens);
          torch::Tensor steps = torch::tensor({got_stats.decode_steps}, torch::kInt64);
          stages.broadcast(steps, 0);
          EXPECT_EQ(got_stats.decode_steps, steps.item<int64_t>());
          EXPECT_EQ(got_stats.shared_prompt_tokens, want_stats.shared_prompt_tokens);
          EXPECT_GT(got_stats.shared_prompt_tokens, 0);
          EXPECT_EQ(got_stats.keep_alive_steps, 0);
          if (rank != 0) {
            // No episode ran here (no tool call either); the schedule was stage 0's.
            EXPECT_TRUE(got_lp.empty());
            for (const auto& t : got) EXPECT_TRUE(t.response_ids.empty());
            continue;
          }
          EXPECT_GE(expect_episodes_of_one_process(got, got_lp, want, want_lp), 3)
              << "too few turns resumed after a tool result to compare";
        }
      },
      120);
}

TEST(AgentRolloutPipelineParallel, KeepAliveStepsHoldTheOtherStageThroughASlowTool) {
  run_ranks(
      2,
      [](int rank, int port) {
        Communicator stages(gloo_world(rank, 2, port, std::chrono::seconds(3)));
        CausalLM reference = reference_model(HeadKind::kLanguageModel, 11);
        CausalLM stage = two_stage_model(rank, 11);
        expect_keep_alive_through_a_slow_tool(reference, stage, stages, &stages);
      },
      60);
}

TEST(AgentRolloutPipelineParallel, StagesWithoutTheirCommunicatorAreRefused) {
  CausalLM stage = two_stage_model(0, 7);
  GenerationConfig config;
  config.max_new_tokens = 8;
  std::vector<agent::Trajectory> out(2);
  try {
    run_in_continuous_turns(2, tool_episodes(out, config.max_new_tokens), stage, config);
    ADD_FAILURE() << "a stage ran without the communicator over its stages";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("pipeline stage 0 of 2"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace hybridflow
