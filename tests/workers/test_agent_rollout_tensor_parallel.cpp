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
        expect_replica_runs_the_episodes_of_one_process(reference, split, tp, nullptr, 23);
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
