// Expert parallelism with the ZeRO optimizer (engine/zero_optimizer.h, as Megatron's distributed optimizer): the
// replicated parameters' gradients and optimizer state are reduce-scattered and partitioned over the whole
// data-parallel group, the experts' only over the ranks owning the same experts. Two AdamW steps with the
// experts split 2 ways on 2 processes (no other owner: the experts' state stays whole) and 2 ways inside 4
// data-parallel processes (2 owners of each expert: its state is partitioned too) give one process's losses,
// gradient norms (every parameter counted once) and weights within 1e-5, while each rank keeps the expected
// fraction of the state. A state taken by name after the first step resumes the second step bit for bit in the
// same layout, and within 1e-6 in the layout without ZeRO. Every rank runs in a forked process over Gloo.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/expert_parallel_fixture.h"
#include "hybridflow/engine/train_engine.h"
#include "parallel/rank_processes.h"

namespace hybridflow {
namespace {

using namespace hybridflow::testing;

constexpr int kSteps = 2;

bool is_expert_name(const std::string& name) { return name.find(".experts.") != std::string::npos; }

// One process's kSteps steps on the whole of rl_batch(), one row per micro-batch.
struct Reference {
  std::vector<StepStats> steps;
  std::map<std::string, torch::Tensor> weights;
};

Reference one_process_steps() {
  CausalLM model = expert_model();
  TrainEngine engine(model.ptr(), parallel_test_optimizer());
  Reference r;
  for (int step = 0; step < kSteps; ++step)
    r.steps.push_back(engine.train_step(rl_batch(), 1, [&](const DataProto& m) { return policy_loss(model, m); }));
  r.weights = parameters_of(*model);
  return r;
}

// A split model and its engine: ZeRO over the data-parallel group (set first, as the workers do) or a plain
// gradient reducer.
struct ExpertZeroReplica {
  ExpertZeroReplica(ExpertParallelComms& layout, bool sharded)
      : layout(layout), model(expert_model()), engine(nullptr) {
    model->set_expert_parallel(ExpertParallelGroup(layout.experts.get()));
    engine = std::make_unique<TrainEngine>(model.ptr(), parallel_test_optimizer());
    if (sharded)
      engine->set_sharded_optimizer(layout.dp);
    else
      engine->set_gradient_reducer([&dp = layout.dp](torch::Tensor& t) { dp.all_reduce(t, ReduceOp::kSum); });
    engine->set_expert_parallel(ExpertParallelGroup(layout.experts.get()), layout.owners.get(), is_expert_name);
  }
  StepStats step() {
    const int world = layout.dp.size(), rank = layout.dp.rank();
    const int64_t rows = rl_batch().batch_size() / world;
    return engine->train_step(rl_batch().slice(rank * rows, (rank + 1) * rows), 1,
                              [&](const DataProto& m) { return policy_loss(model, m); });
  }
  ExpertParallelComms& layout;
  CausalLM model;
  std::unique_ptr<TrainEngine> engine;
};

// The entries of `all` this rank holds (its experts and every replicated tensor).
std::map<std::string, torch::Tensor> held_by(const std::map<std::string, torch::Tensor>& all, CausalLMImpl& model) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& item : model.named_parameters()) out[item.key()] = all.at(item.key());
  return out;
}

void check_expert_parallel_zero_steps(int world, int ep) {
  run_ranks(
      world,
      [&](int rank, int port) {
        const Reference want = one_process_steps();
        ExpertParallelComms layout(gloo_world(rank, world, port), ep);
        ExpertZeroReplica r(layout, /*sharded=*/true);
        const std::string what = std::to_string(world) + " ranks, ep " + std::to_string(ep);
        for (int step = 0; step < kSteps; ++step) {
          const StepStats got = r.step();
          const StepStats& w = want.steps[static_cast<size_t>(step)];
          const std::string at = what + " step " + std::to_string(step + 1);
          EXPECT_NEAR(got.loss, w.loss, 1e-5) << at;
          EXPECT_NEAR(got.grad_norm, w.grad_norm, 1e-5 * (1 + w.grad_norm)) << at;
          EXPECT_EQ(got.tokens, w.tokens) << at;
          EXPECT_EQ(got.step, step + 1) << at;
        }
        expect_same_tensors(parameters_of(*r.model), held_by(want.weights, *r.model), 1e-5,
                            what + ": weights after " + std::to_string(kSteps) + " steps");
        // Two moments and an fp32 master per element of the partitions: the replicated parameters' 1/world,
        // this rank's experts' 1/(world / ep) (each of the 4 buffers padded to its group's size).
        int64_t replicated = 0, experts = 0;
        for (const auto& item : r.model->named_parameters())
          (is_expert_name(item.key()) ? experts : replicated) += item.value().numel();
        const int64_t owners = world / ep;
        const int64_t partitions = replicated / world + experts / owners;
        EXPECT_GE(r.engine->optimizer_state_numel(), 3 * partitions) << what;
        EXPECT_LE(r.engine->optimizer_state_numel(), 3 * (partitions + 2 + 2)) << what;
      },
      180);
}

TEST(ExpertParallelZero, TwoStepsWithExpertsSplitTwoWaysOnTwoRanksEqualOneProcess) {
  check_expert_parallel_zero_steps(2, 2);
}

TEST(ExpertParallelZero, TwoStepsWithTheExpertsStatePartitionedOverTheirOwnersEqualOneProcess) {
  check_expert_parallel_zero_steps(4, 2);
}

TEST(ExpertParallelZero, AStateByNameResumesTheSecondStep) {
  run_ranks(
      4,
      [](int rank, int port) {
        ExpertParallelComms layout(gloo_world(rank, 4, port), 2);
        ExpertZeroReplica uninterrupted(layout, true);
        uninterrupted.step();
        const StepStats second = uninterrupted.step();
        const auto want = parameters_of(*uninterrupted.model);

        // One step, then the weights and the optimizer state by name (collective: the partitions are gathered
        // over their groups) into a fresh replica of each layout.
        ExpertZeroReplica before(layout, true);
        before.step();
        const auto weights = parameters_of(*before.model);
        const TrainEngine::NamedState state = before.engine->named_state();
        EXPECT_EQ(state.step, 1);
        for (bool sharded : {true, false}) {
          const std::string what = sharded ? "resumed with ZeRO" : "resumed without ZeRO";
          ExpertZeroReplica after(layout, sharded);
          load_full_state(*after.model, weights);
          after.engine->load_named_state(state);
          EXPECT_EQ(after.engine->named_state().parameters.size(), state.parameters.size()) << what;
          const StepStats got = after.step();
          EXPECT_EQ(got.step, 2) << what;
          if (sharded) {
            EXPECT_EQ(got.grad_norm, second.grad_norm) << what;
            for (const auto& [name, w] : parameters_of(*after.model))
              EXPECT_TRUE(torch::equal(w, want.at(name))) << what << ": " << name;
          } else {
            EXPECT_NEAR(got.grad_norm, second.grad_norm, 1e-6 * second.grad_norm) << what;
            expect_same_tensors(parameters_of(*after.model), want, 1e-6, what + ": weights after the second step");
          }
        }

        // Without the moments the second step is another step: the comparison above can tell.
        ExpertZeroReplica fresh(layout, true);
        load_full_state(*fresh.model, weights);
        fresh.step();
        int moved_differently = 0;
        for (const auto& [name, w] : parameters_of(*fresh.model))
          moved_differently += !torch::allclose(w, want.at(name), 0.0, 1e-4);
        EXPECT_GT(moved_differently, 0) << "fresh moments should move the weights differently";
      },
      180);
}

}  // namespace
}  // namespace hybridflow
