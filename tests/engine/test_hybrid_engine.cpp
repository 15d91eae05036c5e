// The 3D-HybridEngine on 4 processes: for every training layout (tp x dp = 4x1, 2x2, 1x4) and every
// generation tensor-parallel size that divides it, each resharding mode generates the tokens one process
// generates, moves exactly the bytes of the paper's Table 2, and (hybridflow) holds M / t_g of generation
// weights with no redundant training copy; switching back restores the training weights bit for bit.
#include "hybridflow/engine/hybrid_engine.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "engine/tensor_parallel_fixture.h"
#include "hybridflow/core/error.h"
#include "hybridflow/engine/generation.h"
#include "parallel/rank_processes.h"

namespace hybridflow {
namespace {

using namespace hybridflow::testing;

// Bytes of the weights tensor parallelism splits (everything but norms and the o_proj bias).
int64_t split_weight_bytes(CausalLMImpl& full, int tp) {
  int64_t bytes = 0;
  for (const auto& item : full.named_parameters())
    if (tp > 1 && shard_dim(item.key(), full.config(), tp) != ShardDim::kReplicated) bytes += item.value().nbytes();
  return bytes;
}

TEST(HybridEngine, EveryLayoutPairAndModeGeneratesLikeOneProcessWithTableTwoBytes) {
  run_ranks(
      4,
      [](int rank, int port) {
        ProcessGroup world = gloo_world(rank, 4, port);
        CausalLM reference = reference_model(HeadKind::kLanguageModel, 11);
        GenerationConfig cfg;
        cfg.greedy = true;
        cfg.max_new_tokens = 6;
        const std::vector<std::vector<int64_t>> prompts = {{3, 17, 42}, {5}, {60, 1, 2, 9, 33}, {8, 8}};
        const auto want = generate(reference, prompts, cfg);
        const auto full = parameters_of(*reference);

        for (int t : {4, 2, 1}) {
          for (int t_g = t; t_g >= 1; t_g /= 2) {
            for (ReshardMode mode : {ReshardMode::kHybridFlow, ReshardMode::kHybridFlowV, ReshardMode::kAllGather}) {
              GenerationLayout layout(DeviceMesh(1, 4 / t, t), t_g);
              const std::string what = layout.train().to_string() + " -> tp_g=" + std::to_string(t_g) + " " +
                                       reshard_mode_name(mode);
              Communicator tp(world.split(layout.train().tp_groups()));
              CausalLM train(tensor_parallel_test_config(), HeadKind::kLanguageModel, TensorParallelGroup(&tp));
              load_full_state(*train, full);
              const auto before = parameters_of(*train);
              HybridEngine engine(train, layout, world, mode);

              const ReshardStats stats = engine.to_generation();
              const int64_t m = split_weight_bytes(*reference, t);
              const ReshardCost paper = paper_reshard_cost(mode, layout, m);
              EXPECT_EQ(stats.model_bytes, m) << what;
              EXPECT_EQ(stats.bytes_received, paper.bytes_received) << what;
              EXPECT_EQ(stats.bytes_sent, paper.bytes_received) << what;
              EXPECT_EQ(stats.peak_extra_weight_bytes, paper.generation_weight_bytes) << what;
              if (mode == ReshardMode::kHybridFlow) {
                EXPECT_EQ(stats.redundant_bytes, 0) << what;
              } else {
                EXPECT_EQ(stats.redundant_bytes, m / t) << what;
              }
              EXPECT_EQ(engine.generation_replicas(), 4 / t_g) << what;

              const auto got = generate(engine.generation_model(), prompts, cfg);
              EXPECT_TRUE(torch::equal(got.responses, want.responses)) << what << "\n" << got.responses;

              engine.to_training();
              const auto after = parameters_of(*train);
              for (const auto& [name, value] : before) {
                EXPECT_TRUE(torch::equal(after.at(name), value)) << what << ": " << name << " changed";
              }
              for (const auto& p : train->parameters()) EXPECT_TRUE(p.is_contiguous()) << what;
              EXPECT_THROW(engine.generation_model(), Error);
            }
          }
        }
      },
      180);
}

// Training -> generation -> training -> an optimizer step -> generation again sees the updated weights.
TEST(HybridEngine, GenerationSeesTheWeightsTrainingUpdated) {
  run_ranks(
      4,
      [](int rank, int port) {
        ProcessGroup world = gloo_world(rank, 4, port);
        GenerationLayout layout(DeviceMesh(1, 1, 4), 2);
        Communicator tp(world.split(layout.train().tp_groups()));
        CausalLM train(tensor_parallel_test_config(), HeadKind::kLanguageModel, TensorParallelGroup(&tp));
        CausalLM reference = reference_model(HeadKind::kLanguageModel, 3);
        load_full_state(*train, parameters_of(*reference));
        HybridEngine engine(train, layout, world, ReshardMode::kHybridFlow);
        engine.to_generation();
        engine.to_training();
        {
          torch::NoGradGuard no_grad;
          for (auto& p : train->parameters()) p.mul_(-1.0);
          for (auto& p : reference->parameters()) p.mul_(-1.0);
        }
        GenerationConfig cfg;
        cfg.greedy = true;
        cfg.max_new_tokens = 5;
        engine.to_generation();
        const auto got = generate(engine.generation_model(), {{1, 2, 3}}, cfg);
        EXPECT_TRUE(torch::equal(got.responses, generate(reference, {{1, 2, 3}}, cfg).responses));
        EXPECT_THROW(engine.to_generation(), Error);
        engine.to_training();
        EXPECT_THROW(engine.to_training(), Error);
      },
      60);
}

TEST(HybridEngine, ModeNamesAndPaperCosts) {
  EXPECT_EQ(parse_reshard_mode("hybridflow-v"), ReshardMode::kHybridFlowV);
  EXPECT_THROW(parse_reshard_mode("deepspeed"), Error);
  GenerationLayout layout(DeviceMesh(1, 2, 4), 2);  // t=4, d=2, t_g=2: micro-DP groups of 2
  const int64_t m = 1 << 20;
  EXPECT_EQ(paper_reshard_cost(ReshardMode::kHybridFlow, layout, m).bytes_received, m / 4);
  EXPECT_EQ(paper_reshard_cost(ReshardMode::kHybridFlow, layout, m).generation_weight_bytes, m / 2);
  EXPECT_EQ(paper_reshard_cost(ReshardMode::kHybridFlowV, layout, m).bytes_received, 3 * m / 4);
  EXPECT_EQ(paper_reshard_cost(ReshardMode::kAllGather, layout, m).bytes_received, 7 * m / 8);
  EXPECT_EQ(vanilla_generation_tp_groups(layout),
            (std::vector<std::vector<int>>{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(layout.gen_tp_groups(), (std::vector<std::vector<int>>{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
}

}  // namespace
}  // namespace hybridflow
