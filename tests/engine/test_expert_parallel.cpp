// Expert parallelism (parallel/expert_parallel.h): a Qwen3-MoE model whose experts are split over 2 and 4 ranks,
// each rank running its own rows, gives the logits, loss and gradients of one process on all rows within 1e-5;
// a TrainEngine step over the split model (expert parallelism alone, and inside data parallelism of 4 ranks
// with 2 experts' owners each) takes one process's step: loss, gradient norm and weights after it. Combined with
// tensor parallelism (4 ranks: 2 data-parallel replicas of 2 tensor-parallel ranks, the experts split over the
// replicas and whole on each tensor-parallel rank) the logits, loss, gradients and a step equal one process too.
// Under sequence parallelism (each rank routing its slice of the same rows), with the experts replicated or split,
// the routing, the load-balancing loss and the gradients equal one process's. Gathered experts run alone
// (generation); a size that does not divide the experts is refused naming the key.
// Every rank runs in a forked process over Gloo.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <map>
#include <set>
#include <string>

#include "engine/expert_parallel_fixture.h"
#include "hybridflow/core/error.h"
#include "hybridflow/model/moe.h"
#include "hybridflow/parallel/device_mesh.h"
#include "parallel/rank_processes.h"

namespace hybridflow {
namespace {

using namespace hybridflow::testing;

void check_forward_and_gradients(int ranks) {
  run_ranks(
      ranks,
      [&](int rank, int port) {
        Communicator comm(gloo_world(rank, ranks, port));
        CausalLM whole = expert_model();
        CausalLM split = expert_model();
        split->set_expert_parallel(ExpertParallelGroup(&comm));
        // This rank holds experts [rank E / n, (rank + 1) E / n) of each layer, under their checkpoint names.
        std::set<std::string> experts;
        for (const auto& item : split->named_parameters())
          if (is_expert(item.key())) experts.insert(item.key());
        const int64_t per_rank = 4 / ranks;
        EXPECT_EQ(experts.size(), static_cast<size_t>(2 * per_rank * 3));  // 2 layers x experts x 3 projections
        EXPECT_TRUE(experts.count("model.layers.0.mlp.experts." + std::to_string(rank * per_rank) + ".up_proj.weight"));

        const DataProto mine = rows_of(rank, ranks);
        const auto logits = split->forward(mine.tensor("input_ids"), mine.tensor("attention_mask")).logits;
        const auto want_logits = whole->forward(mine.tensor("input_ids"), mine.tensor("attention_mask")).logits;
        EXPECT_TRUE(torch::allclose(logits, want_logits, 1e-5, 1e-5))
            << "logits differ by " << (logits - want_logits).abs().max().item<double>();

        expect_one_process_loss_and_gradients(split, mine, comm);
        EXPECT_GT(comm.stats().of("all_to_all").calls, 0);
      },
      120);
}

TEST(ExpertParallel, LogitsLossAndGradientsOverTwoAndFourRanksEqualOneProcess) {
  for (int ranks : {2, 4}) check_forward_and_gradients(ranks);
}

// world ranks, expert-parallel groups of ep consecutive ranks; ranks with the same place in their group own the
// same experts.
void check_train_step(int world, int ep) {
  run_ranks(
      world,
      [&](int rank, int port) {
        const StepResult want = one_process_step(expert_model(), policy_loss);
        ExpertParallelComms comms(gloo_world(rank, world, port), ep);
        CausalLM model = expert_model();
        model->set_expert_parallel(ExpertParallelGroup(comms.experts.get()));
        TrainEngine engine(model.ptr(), parallel_test_optimizer());
        engine.set_gradient_reducer([&](torch::Tensor& t) { comms.dp.all_reduce(t, ReduceOp::kSum); });
        engine.set_expert_parallel(ExpertParallelGroup(comms.experts.get()), comms.owners.get(), is_expert);
        const StepStats stats = engine.train_step(rows_of(rank, world), 1, [&](const DataProto& m) {
          return policy_loss(model, m);
        });
        expect_one_process_step(stats, want, *model);
      },
      120);
}

// Mixture-of-experts layers under Ulysses sequence parallelism on 2 ranks holding the same rows, each routing its
// slice of every sequence: with the experts replicated, and split over the same 2 ranks (expert parallelism
// exchanging the slices' tokens). Each rank weighs the shared rows by half (the trainer counts them twice); the
// routing recorded, the load-balancing loss (from the router logits gathered over the sequence), the logits,
// and the gradients summed over the ranks (experts: already whole on their owner) equal one process's.
TEST(ExpertParallel, WithSequenceParallelismRoutingLossAndGradientsEqualOneProcess) {
  run_ranks(
      2,
      [](int rank, int port) {
        Communicator comm(gloo_world(rank, 2, port));
        const DataProto all = rl_batch();
        const auto& ids = all.tensor("input_ids");
        const auto& mask = all.tensor("attention_mask");
        const double tokens = all.tensor("loss_mask").sum().item<double>();
        for (bool split_experts : {false, true}) {
          const std::string what = split_experts ? "experts split" : "experts replicated";
          CausalLM whole = expert_model();
          CausalLM split = expert_model();
          if (split_experts) split->set_expert_parallel(ExpertParallelGroup(&comm));
          split->set_sequence_parallel(SequenceParallelGroup(&comm));
          {
            torch::NoGradGuard no_grad;
            whole->set_router_replay(RouterReplayMode::kRecord);
            split->set_router_replay(RouterReplayMode::kRecord);
            const auto logits = split->forward(ids, mask).logits;
            const auto want_logits = whole->forward(ids, mask).logits;
            EXPECT_TRUE(torch::allclose(logits, want_logits, 1e-5, 1e-5))
                << what << ": logits differ by " << (logits - want_logits).abs().max().item<double>();
            const auto& got = split->recorded_routing().layers;
            const auto& want = whole->recorded_routing().layers;
            ASSERT_EQ(got.size(), want.size()) << what;
            for (size_t j = 0; j < want.size(); ++j)
              EXPECT_TRUE(torch::equal(got[j], want[j])) << what << ": routing of MoE layer " << j;
            whole->set_router_replay(RouterReplayMode::kOff);
            split->set_router_replay(RouterReplayMode::kOff);
          }
          whole->set_keep_router_logits(true);
          split->set_keep_router_logits(true);
          auto want_loss = globally_weighted_loss(whole, all, tokens);
          auto want_aux = whole->load_balancing_loss();
          (want_loss + 0.1 * want_aux).backward();
          auto loss = globally_weighted_loss(split, all, tokens);
          auto aux = split->load_balancing_loss();
          EXPECT_NEAR(aux.item<double>(), want_aux.item<double>(), 1e-5) << what << ": load-balancing loss";
          ((loss + 0.1 * aux) / 2).backward();
          for (auto& item : split->named_parameters())
            if (!(split_experts && is_expert(item.key())) && item.value().grad().defined())
              comm.all_reduce(item.value().mutable_grad());
          expect_same_tensors(grads_by_name(*split), held(grads_by_name(*whole), *split), 1e-5, what + ": gradients");
        }
      },
      120);
}

TEST(ExpertParallel, TrainStepOverTwoAndFourRanksEqualsOneProcess) {
  check_train_step(2, 2);
  check_train_step(4, 4);
}

TEST(ExpertParallel, TrainStepWithTwoWayExpertParallelismInsideFourDataParallelRanksEqualsOneProcess) {
  check_train_step(4, 2);
}

// Expert parallelism ep inside tensor parallelism 2 on 2 * ep ranks: the model split over tp (attention, dense
// parts and vocabulary) and its experts over the ep data-parallel replicas of the same tensor-parallel rank.
struct ExpertAndTensorParallelRank {
  ExpertAndTensorParallelRank(int rank, int port, int ep = 2)
      : world(gloo_world(rank, 2 * ep, port)),
        mesh(1, ep, 2),
        tp(world.split(mesh.tp_groups())),
        dp(world.split(mesh.dp_groups())),
        model(expert_parallel_config(), HeadKind::kLanguageModel, TensorParallelGroup(&tp)) {
    load_full_state(*model, parameters_of(*expert_model()));
    model->set_expert_parallel(ExpertParallelGroup(&dp));
  }
  ProcessGroup world;
  DeviceMesh mesh;
  Communicator tp, dp;  // the data-parallel group is the expert-parallel one
  CausalLM model;
};

void check_logits_loss_and_gradients_with_tensor_parallelism(int ep) {
  run_ranks(
      2 * ep,
      [ep](int rank, int port) {
        ExpertAndTensorParallelRank r(rank, port, ep);
        CausalLM whole = expert_model();
        const ModelConfig config = expert_parallel_config();
        // The experts are whole on both tensor-parallel ranks; the router too.
        for (const auto& item : r.model->named_parameters()) {
          if (is_expert(item.key()) || item.key().ends_with("mlp.gate.weight")) {
            EXPECT_EQ(shard_dim(item.key(), config, 2), ShardDim::kReplicated) << item.key();
          }
        }
        const int experts_per_rank = static_cast<int>(expert_parallel_config().moe.num_experts) / ep;
        const std::string first_own = "model.layers.1.mlp.experts." + std::to_string(r.dp.rank() * experts_per_rank);
        EXPECT_TRUE(r.model->named_parameters().contains(first_own + ".down_proj.weight")) << first_own;

        const DataProto mine = rows_of(r.dp.rank(), ep);
        const int64_t width = config.vocab_size / 2;
        const auto logits = r.model->forward(mine.tensor("input_ids"), mine.tensor("attention_mask")).logits;
        const auto want_logits = whole->forward(mine.tensor("input_ids"), mine.tensor("attention_mask"))
                                     .logits.narrow(-1, r.tp.rank() * width, width);
        EXPECT_TRUE(torch::allclose(logits, want_logits, 1e-5, 1e-5))
            << "logits differ by " << (logits - want_logits).abs().max().item<double>();

        expect_one_process_loss_and_gradients(r.model, mine, r.dp);
        EXPECT_GT(r.dp.stats().of("all_to_all").calls, 0);
      },
      180);
}

TEST(ExpertParallel, WithTensorParallelismLogitsLossAndGradientsEqualOneProcess) {
  check_logits_loss_and_gradients_with_tensor_parallelism(2);
}

// Four ways (one expert per rank) inside tensor parallelism 2: 8 processes.
TEST(ExpertParallel, FourWaysWithTensorParallelismLogitsLossAndGradientsEqualOneProcess) {
  check_logits_loss_and_gradients_with_tensor_parallelism(4);
}

TEST(ExpertParallel, WithTensorParallelismTrainStepEqualsOneProcess) {
  run_ranks(
      4,
      [](int rank, int port) {
        const StepResult want = one_process_step(expert_model(), policy_loss);
        ExpertAndTensorParallelRank r(rank, port);
        const ModelConfig config = expert_parallel_config();
        TrainEngine engine(r.model.ptr(), parallel_test_optimizer());
        engine.set_tensor_parallel(TensorParallelGroup(&r.tp), [&](const std::string& name) {
          return shard_dim(name, config, 2) != ShardDim::kReplicated;
        });
        engine.set_gradient_reducer([&](torch::Tensor& t) { r.dp.all_reduce(t, ReduceOp::kSum); });
        engine.set_expert_parallel(ExpertParallelGroup(&r.dp), nullptr, is_expert);
        const StepStats stats = engine.train_step(rows_of(r.dp.rank(), 2), 1, [&](const DataProto& m) {
          return policy_loss(r.model, m);
        });
        expect_one_process_step(stats, want, *r.model);
      },
      180);
}

TEST(ExpertParallel, GatheredExpertsRunAloneAndAreReleased) {
  run_ranks(2, [](int rank, int port) {
    Communicator comm(gloo_world(rank, 2, port));
    CausalLM whole = expert_model();
    CausalLM split = expert_model();
    split->set_expert_parallel(ExpertParallelGroup(&comm));
    const auto params_before = split->parameters().size();
    split->gather_experts();
    EXPECT_TRUE(split->experts_gathered());
    EXPECT_EQ(split->parameters().size(), params_before);  // the others' experts are not trained here
    const auto calls = comm.stats().of("all_to_all").calls;
    // Each rank alone, on rows of its own length: no exchange with the other.
    const DataProto mine = rows_of(rank, 2).slice(0, 1 + rank);
    torch::NoGradGuard no_grad;
    const auto got = split->forward(mine.tensor("input_ids"), mine.tensor("attention_mask")).logits;
    const auto want = whole->forward(mine.tensor("input_ids"), mine.tensor("attention_mask")).logits;
    EXPECT_TRUE(torch::allclose(got, want, 1e-5, 1e-5));
    EXPECT_EQ(comm.stats().of("all_to_all").calls, calls);
    split->release_gathered_experts();
    EXPECT_FALSE(split->experts_gathered());
    KVCache cache;
    EXPECT_THROW(split->hidden_states(mine.tensor("input_ids"), mine.tensor("attention_mask"), {}, &cache), Error);
  });
}

TEST(ExpertParallel, ASizeThatDoesNotDivideTheExpertsIsRefusedNamingTheKey) {
  run_ranks(3, [](int rank, int port) {
    Communicator comm(gloo_world(rank, 3, port));
    CausalLM model = expert_model();
    try {
      model->set_expert_parallel(ExpertParallelGroup(&comm));
      ADD_FAILURE() << "3 ranks over 4 experts were accepted";
    } catch (const std::exception& e) {
      EXPECT_THAT(e.what(), ::testing::HasSubstr("expert_model_parallel_size 3 does not divide num_experts = 4"));
    }
  });
}

}  // namespace
}  // namespace hybridflow
