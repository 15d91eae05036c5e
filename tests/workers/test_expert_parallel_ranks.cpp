// Expert-parallel groups in a role's processes (workers/expert_parallel_ranks.h). Under tensor parallelism 2 a
// size that is a multiple of 2 folds the tensor-parallel ranks into the group (Megatron's layout with
// expert_tensor_parallel_size 1); otherwise the group is data-parallel ranks. A tiny Qwen3-MoE (4 experts) with
// its experts folded over one replica's 2 tensor-parallel ranks (2 processes), and over 2 replicas' (4 processes,
// one expert each, a layout that data-parallel groups cannot make), gives one process's logits, loss, gradients
// and training step; each expert's work runs once in the group (the ranks share the tokens out), and over one
// replica the experts stay in place for decoding, which draws one process's tokens.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <set>
#include <string>

#include "engine/expert_parallel_fixture.h"
#include "hybridflow/core/error.h"
#include "hybridflow/engine/generation.h"
#include "hybridflow/parallel/device_mesh.h"
#include "hybridflow/workers/expert_parallel_ranks.h"
#include "hybridflow/workers/role_process_groups.h"
#include "parallel/rank_processes.h"

namespace hybridflow {
namespace {

using namespace hybridflow::testing;

const std::string kKey = "actor_rollout_ref.actor.megatron.expert_model_parallel_size";

std::string shape_error(int size, int tp, int dp) {
  try {
    expert_parallel_shape(size, tp, dp, kKey);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ExpertParallelShape, FoldsTheTensorParallelRanksInWhenTheSizeIsAMultipleOfThem) {
  auto shape = [](int size, int tp, int dp) {
    const ExpertParallelShape s = expert_parallel_shape(size, tp, dp, kKey);
    return std::pair(s.tensor_ranks, s.data_ranks);
  };
  EXPECT_EQ(shape(2, 2, 1), std::pair(2, 1));  // exactly the tensor-parallel ranks of one replica
  EXPECT_EQ(shape(8, 2, 4), std::pair(2, 4));  // verl's Qwen3-30B router replay: tp 2, ep 8 on 8 GPUs
  EXPECT_EQ(shape(4, 4, 2), std::pair(4, 1));  // Qwen3-235B: tp 4, ep 4
  EXPECT_EQ(shape(2, 1, 4), std::pair(1, 2));  // no tensor parallelism: data-parallel ranks
  EXPECT_EQ(shape(2, 4, 2), std::pair(1, 2));  // not a multiple of tp 4: data-parallel ranks of each tensor rank
  EXPECT_EQ(shape(1, 2, 2), std::pair(1, 1));
  EXPECT_THAT(shape_error(8, 2, 2), ::testing::HasSubstr(kKey + " = 8 does not divide the role's 2 data-parallel "
                                                         "processes and is not a multiple of "
                                                         "tensor_model_parallel_size 2 dividing them"));
  EXPECT_THAT(shape_error(4, 1, 2), ::testing::HasSubstr(kKey + " = 4 does not divide the role's 2 data-parallel "
                                                         "processes"));
  EXPECT_THAT(shape_error(0, 1, 2), ::testing::HasSubstr(kKey + " must be >= 1, got 0"));
}

// One rank of `replicas` x 2 tensor-parallel ranks, its experts folded over the tensor-parallel ranks of every
// replica (expert_model_parallel_size 2 x replicas), made by the role's own layout code.
struct FoldedRank {
  FoldedRank(int rank, int port, int replicas)
      : world(gloo_world(rank, 2 * replicas, port)),
        coord(mesh_coord_of(rank, 2 * replicas, ParallelLayout{.tp = 2})),
        mesh(1, replicas, 2),
        tp(world.split(mesh.tp_groups())),
        dp(world.split(mesh.dp_groups())),
        model(expert_parallel_config(), HeadKind::kLanguageModel, TensorParallelGroup(&tp)),
        experts(ExpertParallelRanks::join(world, coord, 2 * replicas, kKey)) {
    load_full_state(*model, parameters_of(*expert_model()));
    experts->split(model);
  }
  ProcessGroup world;
  MeshCoord coord;
  DeviceMesh mesh;
  Communicator tp, dp;
  CausalLM model;
  std::unique_ptr<ExpertParallelRanks> experts;
};

// The bytes this rank's expert exchanges put on the wire in one no-gradient forward of `rows`.
int64_t exchanged_bytes(CausalLM& model, const DataProto& rows) {
  torch::NoGradGuard no_grad;
  const auto before = model->expert_parallel().comm()->stats().of("all_to_all").bytes;
  model->forward(rows.tensor("input_ids"), rows.tensor("attention_mask"));
  return model->expert_parallel().comm()->stats().of("all_to_all").bytes - before;
}

void check_forward_and_gradients(int replicas) {
  run_ranks(
      2 * replicas,
      [replicas](int rank, int port) {
        FoldedRank r(rank, port, replicas);
        CausalLM whole = expert_model();
        const int group = 2 * replicas;
        ASSERT_TRUE(r.experts->over_tensor_parallel());
        ASSERT_EQ(r.experts->size(), group);
        EXPECT_EQ(r.model->experts_follow_tensor_parallel(), replicas == 1);
        // Group rank = replica * 2 + tensor rank (Megatron's order) holds experts [g E / n, (g + 1) E / n).
        const int own = r.experts->group().rank();
        EXPECT_EQ(own, r.coord.dp * 2 + r.coord.tp);
        const int per_rank = 4 / group;
        std::set<std::string> held_experts;
        for (const auto& item : r.model->named_parameters())
          if (is_expert(item.key())) held_experts.insert(item.key());
        EXPECT_EQ(held_experts.size(), static_cast<size_t>(2 * per_rank * 3));
        EXPECT_TRUE(held_experts.count("model.layers.0.mlp.experts." + std::to_string(own * per_rank) +
                                       ".gate_proj.weight"));

        const DataProto mine = rows_of(r.coord.dp, replicas);
        const ModelConfig config = expert_parallel_config();
        const int64_t width = config.vocab_size / 2;
        const auto logits = r.model->forward(mine.tensor("input_ids"), mine.tensor("attention_mask")).logits;
        const auto want_logits = whole->forward(mine.tensor("input_ids"), mine.tensor("attention_mask"))
                                     .logits.narrow(-1, r.coord.tp * width, width);
        EXPECT_TRUE(torch::allclose(logits, want_logits, 1e-5, 1e-5))
            << "logits differ by " << (logits - want_logits).abs().max().item<double>();
        expect_one_process_loss_and_gradients(r.model, mine, r.dp);
      },
      180);
}

TEST(ExpertParallelFolded, OverOneReplicasTensorRanksLogitsLossAndGradientsEqualOneProcess) {
  check_forward_and_gradients(1);
}

TEST(ExpertParallelFolded, OverTwoReplicasTensorRanksLogitsLossAndGradientsEqualOneProcess) {
  check_forward_and_gradients(2);
}

// The tensor-parallel ranks share their tokens out: together they send each (token, slot) pair once, half the
// rows of the same group with each rank routing every token itself.
TEST(ExpertParallelFolded, TheTensorRanksShareTheTokensOut) {
  run_ranks(
      2,
      [](int rank, int port) {
        FoldedRank r(rank, port, 1);
        const DataProto all = rl_batch();
        CausalLM unfolded(expert_parallel_config(), HeadKind::kLanguageModel, TensorParallelGroup(&r.tp));
        load_full_state(*unfolded, parameters_of(*expert_model()));
        unfolded->set_expert_parallel(r.experts->group());
        auto group_total = [&](int64_t bytes) {
          auto t = torch::tensor({bytes}, torch::kLong);
          r.world.allreduce(t, ReduceOp::kSum);
          return t.item<int64_t>();
        };
        const int64_t folded_bytes = group_total(exchanged_bytes(r.model, all));
        const int64_t unfolded_bytes = group_total(exchanged_bytes(unfolded, all));
        // Per layer and rank one exchange of the 4 experts' counts (int64); per layer the token rows (32 fp32
        // each) go out and come back: 4 x 8 tokens x top 2 = 64 pairs in the group, or 64 from each rank.
        const int64_t layers = 2, counts = layers * 2 * 4 * 8, row = 32 * 4, pairs = 4 * 8 * 2;
        EXPECT_EQ(folded_bytes - counts, layers * 2 * pairs * row);
        EXPECT_EQ(unfolded_bytes - counts, 2 * layers * 2 * pairs * row);
      },
      180);
}

void check_train_step(int replicas) {
  run_ranks(
      2 * replicas,
      [replicas](int rank, int port) {
        const StepResult want = one_process_step(expert_model(), policy_loss);
        FoldedRank r(rank, port, replicas);
        TrainEngine engine(r.model.ptr(), parallel_test_optimizer());
        use_model_split(engine, r.model);
        if (replicas > 1)
          engine.set_gradient_reducer([&](torch::Tensor& t) { r.dp.all_reduce(t, ReduceOp::kSum); });
        r.experts->use_in(engine);
        const StepStats stats = engine.train_step(rows_of(r.coord.dp, replicas), 1, [&](const DataProto& m) {
          return policy_loss(r.model, m);
        });
        EXPECT_NEAR(stats.loss, want.stats.loss, 1e-5);
        EXPECT_NEAR(stats.grad_norm, want.stats.grad_norm, 1e-5);
        EXPECT_EQ(stats.tokens, want.stats.tokens);
        expect_same_tensors(gather_full_state(*r.model), held(want.weights, *r.model), 1e-5, "weights after the step");
      },
      180);
}

TEST(ExpertParallelFolded, OverOneReplicasTensorRanksTrainStepEqualsOneProcess) { check_train_step(1); }

TEST(ExpertParallelFolded, OverTwoReplicasTensorRanksTrainStepEqualsOneProcess) { check_train_step(2); }

// Over one replica the experts need no gathering to decode: the tensor-parallel ranks decode in step, exchanging
// tokens in every MoE layer, and draw one process's greedy tokens.
TEST(ExpertParallelFolded, OverOneReplicaTheExpertsDecodeInPlace) {
  run_ranks(
      2,
      [](int rank, int port) {
        FoldedRank r(rank, port, 1);
        CausalLM whole = expert_model();
        const ExpertGather moved = r.model->gather_experts();
        EXPECT_EQ(moved.expert_bytes, 0);
        EXPECT_FALSE(r.model->experts_gathered());
        GenerationConfig g;
        g.greedy = true;
        g.max_new_tokens = 6;
        const std::vector<std::vector<int64_t>> prompts = {{3, 9, 27, 17}, {5, 1}, {40, 2, 8}};
        const auto calls = r.experts->group().comm()->stats().of("all_to_all").calls;
        const auto got = generate(r.model, prompts, g);
        const auto want = generate(whole, prompts, g);
        EXPECT_TRUE(torch::equal(got.responses, want.responses)) << got.responses << "\n" << want.responses;
        EXPECT_TRUE(torch::allclose(got.log_probs, want.log_probs, 1e-5, 1e-5))
            << "log-probs differ by " << (got.log_probs - want.log_probs).abs().max().item<double>();
        EXPECT_GT(r.experts->group().comm()->stats().of("all_to_all").calls, calls);
      },
      180);
}

}  // namespace
}  // namespace hybridflow
