// The 3D-HybridEngine on 4 processes: for every training layout (tp x dp = 4x1, 2x2, 1x4) and every
// generation tensor-parallel size that divides it, each resharding mode generates the tokens one process
// generates, moves exactly the bytes of the paper's Table 2, and (hybridflow) holds M / t_g of generation
// weights with no redundant training copy; switching back restores the training weights bit for bit.
// Pipeline stages (2x2x1, 2x1x2, 4x1x1) gather into one unstaged generation model in every mode, or into
// generation stages (p_g = 2) in hybridflow mode. A mixture-of-experts actor whose experts are folded over its
// tensor-parallel ranks switches into unstaged and smaller tensor-parallel layouts with the experts folded over
// the generation ranks, each expert coming whole from the rank that trains it: one process's tokens, no redundant
// copy, the training weights back bit for bit; experts split any other way (over data-parallel replicas, or
// folded over two replicas' tensor ranks) are gathered in their stage and switch the same way.
#include "hybridflow/engine/hybrid_engine.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <set>
#include <string>

#include "engine/expert_parallel_fixture.h"
#include "engine/tensor_parallel_fixture.h"
#include "hybridflow/core/error.h"
#include "hybridflow/engine/generation.h"
#include "hybridflow/model/pipeline_layout.h"
#include "parallel/rank_processes.h"
#include "support/error_of.h"

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

// The generation model's experts, one name each (its up_proj weight), each checked to be the whole model's bit
// for bit (at these sizes the greedy tokens alone may not show a wrong expert).
std::set<std::string> generation_experts(HybridEngine& engine, CausalLM& reference, const std::string& what) {
  std::set<std::string> experts;
  const auto whole = parameters_of(*reference);
  for (const auto& item : engine.generation_model()->named_parameters()) {
    if (!is_expert(item.key())) continue;
    EXPECT_TRUE(torch::equal(item.value(), whole.at(item.key()))) << what << ": " << item.key();
    if (item.key().ends_with("up_proj.weight")) experts.insert(item.key());
  }
  return experts;
}

// Called in the generation layout: the greedy tokens are one process's; switching back restores the
// training weights bit for bit, contiguous; an update to both models reaches generation. Ends in the
// training layout.
void expect_generates_like_one_process(HybridEngine& engine, CausalLM& train, CausalLM& reference,
                                       const std::map<std::string, torch::Tensor>& before, const std::string& what) {
  GenerationConfig cfg;
  cfg.greedy = true;
  cfg.max_new_tokens = 6;
  const std::vector<std::vector<int64_t>> prompts = {{3, 17, 42}, {5}, {60, 1, 2, 9, 33}};
  auto tokens_agree = [&] {
    return torch::equal(generate(engine.generation_model(), prompts, cfg, engine.generation_stages()).responses,
                        generate(reference, prompts, cfg).responses);
  };
  EXPECT_TRUE(tokens_agree()) << what;
  engine.to_training();
  const auto after = parameters_of(*train);
  for (const auto& [name, value] : before)
    EXPECT_TRUE(torch::equal(after.at(name), value)) << what << ": " << name << " changed";
  for (const auto& p : train->parameters()) EXPECT_TRUE(p.is_contiguous()) << what;
  // An update to the training weights (both copies of a tied embedding alike) reaches generation.
  {
    torch::NoGradGuard no_grad;
    for (auto& p : train->parameters()) p.mul_(-1.0);
    for (auto& p : reference->parameters()) p.mul_(-1.0);
  }
  engine.to_generation();
  EXPECT_TRUE(tokens_agree()) << what << " after an update";
  engine.to_training();
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

// Pipeline stages switch to an unstaged generation model (p_g = 1) or to generation stages (p_g = 2). Each
// generation stage gathers the weights of its l = p/p_g training stages inside micro-DP groups of k*l ranks
// (k = t/t_g): every rank sends its contribution to each peer of its group and receives the rest of its
// generation shard, so it holds M/(t_g*p_g) with nothing twice (a last stage's tied copy included). The
// layouts are 2x2x1 (t_g 2 and 1), 2x1x2 and 4x1x1 generating unstaged, and 2x2x1 (t_g 1 and 2), 2x1x2 and
// 4x1x1 generating in 2 stages, untied and tied; the stages generate one process's tokens, switching back
// restores every training weight, and generation then sees an update.
TEST(HybridEngine, PipelineStagesGatherIntoTheGenerationLayout) {
  run_ranks(
      4,
      [](int rank, int port) {
        ProcessGroup world = gloo_world(rank, 4, port);
        struct Case {
          int pp, tp, dp, gen_pp, gen_tp;
          bool tied;
        };
        for (const Case& c : {Case{2, 2, 1, 1, 2, false}, Case{2, 2, 1, 1, 1, false}, Case{2, 2, 1, 1, 1, true},
                              Case{2, 1, 2, 1, 1, false}, Case{4, 1, 1, 1, 1, true}, Case{4, 1, 1, 1, 1, false},
                              Case{2, 2, 1, 2, 1, false}, Case{2, 2, 1, 2, 1, true}, Case{4, 1, 1, 2, 1, true},
                              Case{4, 1, 1, 2, 1, false}, Case{2, 1, 2, 2, 1, true}, Case{2, 2, 1, 2, 2, false}}) {
          ModelConfig config = tensor_parallel_test_config();
          config.num_hidden_layers = 4;
          config.tie_word_embeddings = c.tied;
          torch::manual_seed(21);
          CausalLM reference(config, HeadKind::kLanguageModel);
          const GenerationLayout layout(DeviceMesh(c.pp, c.dp, c.tp), c.gen_tp, c.gen_pp);
          const std::string what = layout.train().to_string() + " -> pp_g=" + std::to_string(c.gen_pp) +
                                   " tp_g=" + std::to_string(c.gen_tp) + (c.tied ? " tied" : "");
          Communicator tp(world.split(layout.train().tp_groups()));
          const MeshCoords me = layout.train().coords(rank);
          CausalLM train(config, HeadKind::kLanguageModel, TensorParallelGroup(&tp), PipelineStage{me.pp, c.pp});
          load_full_state(*train, parameters_of(*reference));
          const auto before = parameters_of(*train);
          HybridEngine engine(train, layout, world, ReshardMode::kHybridFlow);
          EXPECT_EQ(engine.generation_replicas(), 4 / (c.gen_tp * c.gen_pp)) << what;
          EXPECT_EQ(engine.generation_replica(), layout.coords(rank).dp) << what << ": the replica prompts go to";
          EXPECT_EQ(engine.generation_stages() != nullptr, c.gen_pp > 1) << what;

          const ReshardStats stats = engine.to_generation();
          // M is every weight (each stage holds only its own); the generation shard is M / t_g of the split
          // weights of the rank's generation stage.
          const PipelineStage gen_stage{layout.coords(rank).pp, c.gen_pp};
          const int k = c.tp / c.gen_tp, l = c.pp / c.gen_pp;
          int64_t model_bytes = 0, generation_bytes = 0, contributed = 0;
          for (const auto& item : reference->named_parameters()) {
            const int64_t bytes = item.value().nbytes();
            model_bytes += bytes;
            if (!stage_holds(item.key(), config, HeadKind::kLanguageModel, gen_stage)) continue;
            const bool gen_split = shard_dim(item.key(), config, c.gen_tp) != ShardDim::kReplicated && c.gen_tp > 1;
            const int64_t gen_bytes = gen_split ? bytes / c.gen_tp : bytes;
            generation_bytes += gen_bytes;
            // A later generation stage's tied copy is gathered from the last training stage's copy.
            const bool copy = item.key() == "model.embed_tokens.weight" && c.tied && !gen_stage.first();
            const int owner = copy ? c.pp - 1 : owning_stage(item.key(), config, c.pp);
            if (owner != me.pp) continue;
            // A split weight's training shard is its piece; a weight whole on the stage goes out in k chunks.
            const bool train_split = c.tp > 1 && shard_dim(item.key(), config, c.tp) != ShardDim::kReplicated;
            const int64_t numel = gen_bytes / 4, r = me.tp % k;
            contributed += train_split ? bytes / c.tp : 4 * (numel * (r + 1) / k - numel * r / k);
          }
          EXPECT_EQ(stats.model_bytes, model_bytes) << what;
          EXPECT_EQ(stats.peak_extra_weight_bytes, generation_bytes) << what;
          EXPECT_EQ(stats.bytes_sent, contributed * (k * l - 1)) << what;
          EXPECT_EQ(stats.bytes_received, generation_bytes - contributed) << what;
          EXPECT_EQ(stats.redundant_bytes, 0) << what;

          expect_generates_like_one_process(engine, train, reference, before, what);
        }
      },
      240);
}

// The two baselines with pipeline stages: every rank gathers the whole model, from its replica's t*p ranks
// (hybridflow-v) or from the world with each replica sending 1/d (allgather), so each receives the model less
// what it sent, holds M extra and keeps its training weights apart; the tokens are one process's.
TEST(HybridEngine, BaselinesWithPipelineStagesGatherTheWholeModel) {
  run_ranks(
      4,
      [](int rank, int port) {
        ProcessGroup world = gloo_world(rank, 4, port);
        struct Case {
          int pp, tp, dp, gen_tp;
          bool tied;
        };
        for (const Case& c : {Case{2, 2, 1, 1, false}, Case{2, 2, 1, 2, true}, Case{2, 1, 2, 1, false},
                              Case{4, 1, 1, 1, true}}) {
          for (ReshardMode mode : {ReshardMode::kHybridFlowV, ReshardMode::kAllGather}) {
            ModelConfig config = tensor_parallel_test_config();
            config.num_hidden_layers = 4;
            config.tie_word_embeddings = c.tied;
            torch::manual_seed(23);
            CausalLM reference(config, HeadKind::kLanguageModel);
            const GenerationLayout layout(DeviceMesh(c.pp, c.dp, c.tp), c.gen_tp);
            const std::string what = reshard_mode_name(mode) + " " + layout.train().to_string() +
                                     " -> tp_g=" + std::to_string(c.gen_tp) + (c.tied ? " tied" : "");
            Communicator tp(world.split(layout.train().tp_groups()));
            const MeshCoords me = layout.train().coords(rank);
            CausalLM train(config, HeadKind::kLanguageModel, TensorParallelGroup(&tp), PipelineStage{me.pp, c.pp});
            load_full_state(*train, parameters_of(*reference));
            const auto before = parameters_of(*train);
            HybridEngine engine(train, layout, world, mode);
            EXPECT_EQ(engine.generation_replicas(), 4 / c.gen_tp) << what;

            const ReshardStats stats = engine.to_generation();
            // What this rank sends: 1/d (allgather; 1 for hybridflow-v) of its piece of every weight its stage
            // owns, where a weight whole on the stage is cut into t pieces.
            const int d = mode == ReshardMode::kAllGather ? c.dp : 1;
            const int group = mode == ReshardMode::kAllGather ? 4 : c.tp * c.pp;
            int64_t model_bytes = 0, contributed = 0, training_bytes = 0;
            for (const auto& item : reference->named_parameters()) {
              const int64_t numel = item.value().numel();
              model_bytes += 4 * numel;
              if (owning_stage(item.key(), config, c.pp) != me.pp) continue;
              const bool split = c.tp > 1 && shard_dim(item.key(), config, c.tp) != ShardDim::kReplicated;
              const int64_t piece = split ? numel / c.tp : numel * (me.tp + 1) / c.tp - numel * me.tp / c.tp;
              contributed += 4 * (piece * (me.dp % d + 1) / d - piece * (me.dp % d) / d);
            }
            for (const auto& p : train->parameters()) training_bytes += p.nbytes();
            EXPECT_EQ(stats.model_bytes, model_bytes) << what;
            EXPECT_EQ(stats.peak_extra_weight_bytes, model_bytes) << what;
            EXPECT_EQ(stats.bytes_sent, contributed * (group - 1)) << what;
            EXPECT_EQ(stats.bytes_received, model_bytes - contributed) << what;
            EXPECT_EQ(stats.redundant_bytes, training_bytes) << what;

            expect_generates_like_one_process(engine, train, reference, before, what);
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

TEST(HybridEngine, ExpertsFoldedOverTheTensorRanksFoldOverTheGenerationRanks) {
  run_ranks(
      4,
      [](int rank, int port) {
        ProcessGroup world = gloo_world(rank, 4, port);
        struct Case {
          int pp, tp, dp, gen_pp, gen_tp;
        };
        for (const Case& c : {Case{2, 2, 1, 1, 2}, Case{2, 2, 1, 1, 1}, Case{1, 2, 2, 1, 1}, Case{2, 2, 1, 2, 1}}) {
          const ModelConfig config = expert_parallel_config();  // 2 sparse layers of 4 experts
          CausalLM reference = expert_model();
          const GenerationLayout layout(DeviceMesh(c.pp, c.dp, c.tp), c.gen_tp, c.gen_pp);
          const std::string what = layout.train().to_string() + " -> pp_g=" + std::to_string(c.gen_pp) +
                                   " tp_g=" + std::to_string(c.gen_tp);
          Communicator tp(world.split(layout.train().tp_groups()));
          const MeshCoords me = layout.train().coords(rank);
          CausalLM train(config, HeadKind::kLanguageModel, TensorParallelGroup(&tp), PipelineStage{me.pp, c.pp});
          load_full_state(*train, parameters_of(*reference));
          train->set_expert_parallel(ExpertParallelGroup(&tp), /*over_tensor_parallel=*/true);
          ASSERT_TRUE(train->experts_follow_tensor_parallel()) << what;
          const auto before = parameters_of(*train);
          HybridEngine engine(train, layout, world, ReshardMode::kHybridFlow);
          const ReshardStats stats = engine.to_generation();
          EXPECT_EQ(stats.redundant_bytes, 0) << what;
          // Generation tensor rank q holds experts [q E / t_g, (q + 1) E / t_g) of its stage's sparse layers.
          const std::set<std::string> experts = generation_experts(engine, reference, what);
          const int per_rank = 4 / c.gen_tp, q = layout.coords(rank).tp;
          EXPECT_EQ(experts.size(), static_cast<size_t>(2 / c.gen_pp * per_rank)) << what;
          const int layer = c.gen_pp == 1 ? 1 : layout.coords(rank).pp;
          EXPECT_TRUE(experts.count("model.layers." + std::to_string(layer) + ".mlp.experts." +
                                    std::to_string(q * per_rank) + ".up_proj.weight"))
              << what;
          expect_generates_like_one_process(engine, train, reference, before, what);
        }
      },
      240);
}

// Experts split any other way (over data-parallel replicas, or folded over two replicas' tensor ranks) are
// gathered in their stage and sent whole into the generation layout, folded over its tensor ranks: one
// process's tokens, no training weight held twice, the training weights back bit for bit.
TEST(HybridEngine, SplitExpertsGatherInTheirStageAndFoldOverTheGenerationRanks) {
  run_ranks(
      4,
      [](int rank, int port) {
        ProcessGroup world = gloo_world(rank, 4, port);
        struct Case {
          int pp, tp, dp, gen_pp, gen_tp;
          bool over_tensor_ranks;  // ep 4: both replicas' tensor ranks; else ep 2 over the data-parallel replicas
        };
        for (const Case& c : {Case{2, 1, 2, 1, 1, false}, Case{1, 2, 2, 1, 1, false}, Case{1, 2, 2, 1, 2, false},
                              Case{1, 2, 2, 1, 1, true}, Case{1, 2, 2, 1, 2, true}}) {
          const ModelConfig config = expert_parallel_config();  // 2 sparse layers of 4 experts
          CausalLM reference = expert_model();
          const GenerationLayout layout(DeviceMesh(c.pp, c.dp, c.tp), c.gen_tp, c.gen_pp);
          const std::string what = layout.train().to_string() + (c.over_tensor_ranks ? " ep 4" : " ep 2 over dp") +
                                   " -> tp_g=" + std::to_string(c.gen_tp);
          Communicator tp(world.split(layout.train().tp_groups()));
          Communicator ep(world.split(layout.train().dp_blocks(2, c.over_tensor_ranks)));
          const MeshCoords me = layout.train().coords(rank);
          CausalLM train(config, HeadKind::kLanguageModel, TensorParallelGroup(&tp), PipelineStage{me.pp, c.pp});
          load_full_state(*train, parameters_of(*reference));
          train->set_expert_parallel(ExpertParallelGroup(&ep), c.over_tensor_ranks);
          ASSERT_FALSE(train->experts_follow_tensor_parallel()) << what;
          const auto before = parameters_of(*train);
          HybridEngine engine(train, layout, world, ReshardMode::kHybridFlow);
          const ReshardStats stats = engine.to_generation();
          EXPECT_EQ(stats.redundant_bytes, 0) << what;
          EXPECT_FALSE(train->experts_gathered()) << what << ": the stage's gathered set is dropped";
          EXPECT_GT(stats.expert_bytes_received, 0) << what;
          // Generation tensor rank q holds experts [q E / t_g, (q + 1) E / t_g) of both sparse layers.
          const std::set<std::string> experts = generation_experts(engine, reference, what);
          const int per_rank = 4 / c.gen_tp, q = layout.coords(rank).tp;
          EXPECT_EQ(experts.size(), static_cast<size_t>(2 * per_rank)) << what;
          for (const int layer : {0, 1})
            EXPECT_TRUE(experts.count("model.layers." + std::to_string(layer) + ".mlp.experts." +
                                      std::to_string(q * per_rank + per_rank - 1) + ".up_proj.weight"))
                << what << " layer " << layer;
          expect_generates_like_one_process(engine, train, reference, before, what);
        }
        // The baselines keep their own groups: refused by name.
        const GenerationLayout unstaged(DeviceMesh(1, 2, 2), 1, 1);
        Communicator tp(world.split(unstaged.train().tp_groups())), dp(world.split(unstaged.train().dp_groups()));
        CausalLM split(expert_parallel_config(), HeadKind::kLanguageModel, TensorParallelGroup(&tp));
        split->set_expert_parallel(ExpertParallelGroup(&dp));
        EXPECT_THAT(error_of([&] { HybridEngine e(split, unstaged, world, ReshardMode::kAllGather); }),
                    ::testing::HasSubstr("switches layouts in reshard mode hybridflow, not allgather"));
      },
      240);
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
