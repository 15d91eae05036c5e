// ZeRO stage 1 against plain data parallelism on 4 processes (dp 4, and tp 2 x dp 2): two PPO steps give
// the same losses, gradient norms and weights, while each rank holds about 1/d of the optimizer state.
// The optimizer state moves between layouts by parameter name: a step taken in one layout with ZeRO
// continues in another, with or without ZeRO, as if nothing had changed.
#include "hybridflow/engine/zero_optimizer.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "engine/tensor_parallel_fixture.h"
#include "hybridflow/core/error.h"
#include "hybridflow/engine/train_engine.h"
#include "hybridflow/parallel/device_mesh.h"
#include "parallel/rank_processes.h"

namespace hybridflow {
namespace {

using namespace hybridflow::testing;

struct Trained {
  std::vector<StepStats> steps;
  std::map<std::string, torch::Tensor> weights;
  int64_t state_numel = 0;
};

Trained train_two_steps(Communicator& tp, Communicator& dp, bool sharded) {
  CausalLM model(tensor_parallel_test_config(), HeadKind::kLanguageModel, TensorParallelGroup(&tp));
  load_full_state(*model, parameters_of(*reference_model(HeadKind::kLanguageModel)));
  OptimizerOptions options;
  options.schedule.lr = 1e-3;
  options.eps = 1e-4;
  options.grad_clip = 0.5;
  TrainEngine engine(model.ptr(), options);
  const ModelConfig config = tensor_parallel_test_config();
  engine.set_tensor_parallel(TensorParallelGroup(&tp), [&](const std::string& name) {
    return shard_dim(name, config, tp.size()) != ShardDim::kReplicated;
  });
  if (sharded)
    engine.set_sharded_optimizer(dp);
  else
    engine.set_gradient_reducer([&dp](torch::Tensor& flat) { dp.all_reduce(flat); });
  const DataProto batch = rl_batch();
  const int64_t rows = batch.batch_size() / dp.size();
  const DataProto mine = batch.slice(dp.rank() * rows, (dp.rank() + 1) * rows);
  Trained out;
  for (int step = 0; step < 2; ++step)
    out.steps.push_back(engine.train_step(mine, 1, [&](const DataProto& m) { return policy_loss(model, m); }));
  out.weights = gather_full_state(*model);
  out.state_numel = engine.optimizer_state_numel();
  if (sharded) {
    EXPECT_THROW(engine.save_state("/nonexistent/state.pt"), Error);
  }
  return out;
}

OptimizerOptions zero_test_optimizer() {
  OptimizerOptions options;
  options.schedule.lr = 1e-3;
  options.eps = 1e-4;
  options.grad_clip = 0.5;
  return options;
}

// A model and engine in the layout (tp, dp), with ZeRO or a gradient reducer over dp.
struct Replica {
  Replica(Communicator& tp, Communicator& dp, bool sharded)
      : model(tensor_parallel_test_config(), HeadKind::kLanguageModel, TensorParallelGroup(&tp)),
        engine(model.ptr(), zero_test_optimizer()),
        dp(dp) {
    load_full_state(*model, parameters_of(*reference_model(HeadKind::kLanguageModel)));
    const ModelConfig config = tensor_parallel_test_config();
    engine.set_tensor_parallel(TensorParallelGroup(&tp), [&](const std::string& name) {
      return shard_dim(name, config, tp.size()) != ShardDim::kReplicated;
    });
    if (sharded)
      engine.set_sharded_optimizer(dp);
    else if (dp.size() > 1)
      engine.set_gradient_reducer([&dp](torch::Tensor& flat) { dp.all_reduce(flat); });
  }
  StepStats step() {
    const DataProto batch = rl_batch();
    const int64_t rows = batch.batch_size() / dp.size();
    return engine.train_step(batch.slice(dp.rank() * rows, (dp.rank() + 1) * rows), 1,
                             [&](const DataProto& m) { return policy_loss(model, m); });
  }
  CausalLM model;
  TrainEngine engine;
  Communicator& dp;
};

// What a checkpoint holds: the weights and the optimizer state as whole tensors by name.
struct WholeState {
  std::map<std::string, torch::Tensor> weights;
  TrainEngine::NamedState optimizer;
};

WholeState whole_state_of(Replica& r) {
  WholeState out;
  out.weights = gather_full_state(*r.model);
  out.optimizer = r.engine.named_state();
  std::map<std::string, torch::Tensor> avg, avg_sq;
  for (auto& [name, p] : out.optimizer.parameters) {
    avg[name] = p.exp_avg;
    avg_sq[name] = p.exp_avg_sq;
  }
  const auto& tp = r.model->tensor_parallel();
  avg = gather_full_tensors(avg, r.model->config(), tp);
  avg_sq = gather_full_tensors(avg_sq, r.model->config(), tp);
  for (auto& [name, p] : out.optimizer.parameters) {
    p.exp_avg = avg.at(name);
    p.exp_avg_sq = avg_sq.at(name);
  }
  return out;
}

// Loads whole tensors into a replica of any layout: each rank takes its shards.
void load_whole_state(Replica& r, const WholeState& whole) {
  load_full_state(*r.model, whole.weights);
  TrainEngine::NamedState mine = whole.optimizer;
  const auto& tp = r.model->tensor_parallel();
  for (auto& [name, p] : mine.parameters) {
    p.exp_avg = checkpoint_shard(name, p.exp_avg, r.model->config(), tp).clone();
    p.exp_avg_sq = checkpoint_shard(name, p.exp_avg_sq, r.model->config(), tp).clone();
  }
  r.engine.load_named_state(mine);
}

TEST(ZeroOptimizer, StateMovesBetweenLayoutsByParameterName) {
  run_ranks(
      4,
      [](int rank, int port) {
        ProcessGroup world = gloo_world(rank, 4, port);
        // Two steps without interruption in the first layout.
        DeviceMesh first(1, 2, 2);
        Communicator tp2(world.split(first.tp_groups()));
        Communicator dp2(world.split(first.dp_groups()));
        Replica uninterrupted(tp2, dp2, true);
        uninterrupted.step();
        const StepStats second_step = uninterrupted.step();
        const auto want = gather_full_state(*uninterrupted.model);

        // One step in the first layout, then the second step in others from the state by name.
        Replica before(tp2, dp2, true);
        before.step();
        const WholeState saved = whole_state_of(before);
        EXPECT_EQ(saved.optimizer.step, 1);
        struct Target {
          int tp;
          bool sharded;
        };
        for (const Target& target : {Target{1, true}, Target{4, false}, Target{2, false}}) {
          const std::string what = "tp " + std::to_string(target.tp) + (target.sharded ? " with ZeRO" : " plain");
          DeviceMesh mesh(1, 4 / target.tp, target.tp);
          Communicator tp(world.split(mesh.tp_groups()));
          Communicator dp(world.split(mesh.dp_groups()));
          Replica after(tp, dp, target.sharded);
          load_whole_state(after, saved);
          EXPECT_EQ(after.engine.step(), 1) << what;
          const StepStats stats = after.step();
          EXPECT_EQ(stats.step, 2) << what;
          EXPECT_NEAR(stats.grad_norm, second_step.grad_norm, 1e-5 * second_step.grad_norm) << what;
          expect_same_tensors(gather_full_state(*after.model), want, 1e-6, what + " weights after the second step");
        }

        // Without the moments the second step is another step: the comparison above can tell.
        Replica fresh(tp2, dp2, true);
        load_full_state(*fresh.model, saved.weights);
        fresh.step();
        double furthest = 0;
        for (const auto& [name, w] : gather_full_state(*fresh.model))
          furthest = std::max(furthest, (w - want.at(name)).abs().max().item<double>());
        EXPECT_GT(furthest, 1e-4) << "fresh moments should move the weights differently";
      },
      120);
}

TEST(ZeroOptimizer, MatchesPlainDataParallelismWithAPartitionOfTheState) {
  run_ranks(
      4,
      [](int rank, int port) {
        ProcessGroup world = gloo_world(rank, 4, port);
        for (int tp_size : {1, 2}) {
          DeviceMesh mesh(1, 4 / tp_size, tp_size);
          const std::string what = mesh.to_string();
          Communicator tp(world.split(mesh.tp_groups()));
          Communicator dp(world.split(mesh.dp_groups()));
          const Trained plain = train_two_steps(tp, dp, false);
          const Trained zero = train_two_steps(tp, dp, true);
          for (size_t i = 0; i < plain.steps.size(); ++i) {
            EXPECT_NEAR(zero.steps[i].loss, plain.steps[i].loss, 1e-6) << what << " step " << i;
            EXPECT_NEAR(zero.steps[i].grad_norm, plain.steps[i].grad_norm, 1e-5 * plain.steps[i].grad_norm) << what;
            EXPECT_EQ(zero.steps[i].tokens, plain.steps[i].tokens) << what;
            EXPECT_EQ(zero.steps[i].step, static_cast<int64_t>(i + 1)) << what;
          }
          expect_same_tensors(zero.weights, plain.weights, 1e-6, what + " weights after two steps");
          // Plain: two Adam moments per local parameter. ZeRO: two moments and an fp32 master per element of
          // a 1/d partition (padded to d in each of two groups).
          const int64_t local = plain.state_numel / 2, d = dp.size();
          EXPECT_LE(zero.state_numel, 3 * (local / d + 2)) << what;
          EXPECT_GE(zero.state_numel, 3 * (local / d)) << what;
        }
      },
      120);
}

}  // namespace
}  // namespace hybridflow
