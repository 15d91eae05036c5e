// ZeRO stage 1 against plain data parallelism on 4 processes (dp 4, and tp 2 x dp 2): two PPO steps give
// the same losses, gradient norms and weights, while each rank holds about 1/d of the optimizer state.
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
