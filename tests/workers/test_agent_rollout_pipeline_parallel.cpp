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
        expect_replica_runs_the_episodes_of_one_process(reference, stage, stages, &stages, 29);
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
