// Expert-parallel groups in a role's processes (workers/expert_parallel_ranks.h). Under tensor parallelism 2 a
// size that is a multiple of 2 folds the tensor-parallel ranks into the group (Megatron's layout with
// expert_tensor_parallel_size 1); otherwise the group is data-parallel ranks. A tiny Qwen3-MoE (4 experts) with
// its experts folded over one replica's 2 tensor-parallel ranks (2 processes), and over 2 replicas' (4 processes,
// one expert each, a layout that data-parallel groups cannot make), gives one process's logits, loss, gradients
// and training step. Over one replica each rank runs its own experts on the tokens routed to them and one
// all-reduce sums the parts (no exchange), and the experts stay in place for decoding, which draws one process's
// tokens; over two, a replica's ranks share its tokens out around the exchange (half the rows each).
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

// The bytes and calls of `op` on `comm` in one no-gradient forward of `rows`.
std::pair<int64_t, int64_t> forward_traffic(CausalLM& model, const DataProto& rows, Communicator& comm,
                                            const std::string& op) {
  torch::NoGradGuard no_grad;
  const OpStats before = comm.stats().of(op);
  model->forward(rows.tensor("input_ids"), rows.tensor("attention_mask"));
  const OpStats after = comm.stats().of(op);
  return {after.bytes - before.bytes, after.calls - before.calls};
}

// Folded over one replica's 2 tensor-parallel ranks, the experts need no exchange: each rank runs its own on the
// tokens routed to them and one all-reduce per sparse layer sums the parts, as a row-parallel MLP does.
TEST(ExpertParallelFolded, OverOneReplicaTheRanksSumTheirExpertsPartsLikeARowParallelMlp) {
  run_ranks(
      2,
      [](int rank, int port) {
        FoldedRank r(rank, port, 1);
        CausalLM replicated(expert_parallel_config(), HeadKind::kLanguageModel, TensorParallelGroup(&r.tp));
        load_full_state(*replicated, parameters_of(*expert_model()));
        const DataProto all = rl_batch();
        EXPECT_EQ(forward_traffic(r.model, all, *r.experts->group().comm(), "all_to_all").first, 0);
        const auto folded = forward_traffic(r.model, all, r.tp, "all_reduce");
        const auto whole = forward_traffic(replicated, all, r.tp, "all_reduce");
        // 2 sparse layers of 4 x 8 tokens of 32 fp32.
        EXPECT_EQ(folded.second - whole.second, 2);
        EXPECT_EQ(folded.first - whole.first, 2 * 4 * 8 * 32 * 4);
      },
      180);
}

// Folded over 2 replicas' tensor-parallel ranks (4 processes), the 2 ranks of a replica share its tokens out:
// together they send each (token, slot) pair once, half the rows of the same group with each rank routing all of
// its replica's tokens itself.
TEST(ExpertParallelFolded, OverTwoReplicasTheTensorRanksShareTheTokensOut) {
  run_ranks(
      4,
      [](int rank, int port) {
        FoldedRank r(rank, port, 2);
        const DataProto mine = rows_of(r.coord.dp, 2);
        CausalLM each_routes_all(expert_parallel_config(), HeadKind::kLanguageModel, TensorParallelGroup(&r.tp));
        load_full_state(*each_routes_all, parameters_of(*expert_model()));
        each_routes_all->set_expert_parallel(r.experts->group());
        Communicator& ep = *r.experts->group().comm();
        auto group_total = [&](int64_t bytes) {
          auto t = torch::tensor({bytes}, torch::kLong);
          r.world.allreduce(t, ReduceOp::kSum);
          return t.item<int64_t>();
        };
        const int64_t folded = group_total(forward_traffic(r.model, mine, ep, "all_to_all").first);
        const int64_t unfolded = group_total(forward_traffic(each_routes_all, mine, ep, "all_to_all").first);
        // Per layer and rank one exchange of the 4 experts' counts (int64); per layer the token rows (32 fp32
        // each) go out and come back: 2 replicas x 2 x 8 tokens x top 2 = 64 pairs in the group, or 32 from each
        // of the 4 ranks.
        const int64_t layers = 2, counts = layers * 4 * 4 * 8, row = 32 * 4, pairs = 2 * 2 * 8 * 2;
        EXPECT_EQ(folded - counts, layers * 2 * pairs * row);
        EXPECT_EQ(unfolded - counts, 2 * layers * 2 * pairs * row);
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
        expect_one_process_step(stats, want, *r.model);
      },
      180);
}

TEST(ExpertParallelFolded, OverOneReplicasTensorRanksTrainStepEqualsOneProcess) { check_train_step(1); }

TEST(ExpertParallelFolded, OverTwoReplicasTensorRanksTrainStepEqualsOneProcess) { check_train_step(2); }

// Over one replica the experts need no gathering to decode: the tensor-parallel ranks decode in step, summing
// their experts' parts in every MoE layer, and draw one process's greedy tokens and log-probs.
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
        const auto reduces = r.tp.stats().of("all_reduce").calls;
        const auto got = generate(r.model, prompts, g);
        const auto want = generate(whole, prompts, g);
        EXPECT_TRUE(torch::equal(got.responses, want.responses)) << got.responses << "\n" << want.responses;
        EXPECT_TRUE(torch::allclose(got.log_probs, want.log_probs, 1e-5, 1e-5))
            << "log-probs differ by " << (got.log_probs - want.log_probs).abs().max().item<double>();
        EXPECT_GT(r.tp.stats().of("all_reduce").calls, reduces);
      },
      180);
}

}  // namespace
}  // namespace hybridflow
