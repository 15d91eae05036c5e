// Tensor and data parallelism against one process: for layouts tp x dp = 1x4, 2x2 and 4x1 on 4 processes,
// log-prob inference, one PPO policy step and one value step give the single-process loss, gradient norm,
// gradients and updated weights; greedy generation under tensor parallelism gives the same tokens.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "engine/tensor_parallel_fixture.h"
#include "hybridflow/core/error.h"
#include "hybridflow/engine/generation.h"
#include "hybridflow/engine/train_engine.h"
#include "hybridflow/parallel/device_mesh.h"
#include "parallel/rank_processes.h"

namespace hybridflow {
namespace {

using namespace hybridflow::testing;

StepResult reference_step(HeadKind head, ModelLossFn loss, const ModelConfig& config = tensor_parallel_test_config()) {
  return one_process_step(reference_model(head, 1234, config), loss);
}

// One step of `loss` on this rank's data-parallel rows with a model split over `tp`.
StepResult parallel_step(HeadKind head, ModelLossFn loss, Communicator& tp, Communicator& dp,
                         const ModelConfig& config = tensor_parallel_test_config()) {
  CausalLM model(config, head, TensorParallelGroup(&tp));
  load_full_state(*model, parameters_of(*reference_model(head, 1234, config)));
  TrainEngine engine(model.ptr(), parallel_test_optimizer());
  engine.set_tensor_parallel(TensorParallelGroup(&tp), [&](const std::string& name) {
    return shard_dim(name, config, tp.size()) != ShardDim::kReplicated;
  });
  if (dp.size() > 1) engine.set_gradient_reducer([&dp](torch::Tensor& flat) { dp.all_reduce(flat); });
  const DataProto batch = rl_batch();
  const int64_t rows = batch.batch_size() / dp.size();
  StepResult r;
  r.stats = engine.train_step(batch.slice(dp.rank() * rows, (dp.rank() + 1) * rows), 1,
                              [&](const DataProto& m) { return loss(model, m); });
  r.grads = gather_full_grads(*model);
  r.weights = gather_full_state(*model);
  return r;
}

void expect_same_step(const StepResult& got, const StepResult& want, const std::string& what) {
  EXPECT_NEAR(got.stats.loss, want.stats.loss, 1e-5) << what;
  EXPECT_NEAR(got.stats.grad_norm, want.stats.grad_norm, 1e-5 * want.stats.grad_norm) << what;
  EXPECT_EQ(got.stats.tokens, want.stats.tokens) << what;
  expect_same_tensors(got.grads, want.grads, 2e-6, what + " gradients");
  expect_same_tensors(got.weights, want.weights, 2e-6, what + " updated weights");
}

TEST(TensorParallelTraining, LayoutsOnFourProcessesMatchOneProcess) {
  run_ranks(
      4,
      [](int rank, int port) {
        ProcessGroup world = gloo_world(rank, 4, port);
        const StepResult policy_ref = reference_step(HeadKind::kLanguageModel, policy_loss);
        const StepResult value_ref = reference_step(HeadKind::kValue, value_loss);
        ASSERT_GT(policy_ref.stats.grad_norm, parallel_test_optimizer().grad_clip)
            << "the test should exercise clipping";
        const DataProto batch = rl_batch();
        CausalLM reference = reference_model(HeadKind::kLanguageModel);
        torch::Tensor ref_log_probs;
        {
          torch::NoGradGuard no_grad;
          ref_log_probs = response_log_probs(reference, batch.tensor("input_ids"), batch.tensor("attention_mask"),
                                             kResponseLen).log_probs;
        }
        for (int tp_size : {1, 2, 4}) {
          DeviceMesh mesh(1, 4 / tp_size, tp_size);
          const std::string what = "layout " + mesh.to_string();
          Communicator tp(world.split(mesh.tp_groups()));
          Communicator dp(world.split(mesh.dp_groups()));

          CausalLM split(tensor_parallel_test_config(), HeadKind::kLanguageModel, TensorParallelGroup(&tp));
          load_full_state(*split, parameters_of(*reference));
          {
            torch::NoGradGuard no_grad;
            auto lp = response_log_probs(split, batch.tensor("input_ids"), batch.tensor("attention_mask"),
                                         kResponseLen).log_probs;
            EXPECT_TRUE(torch::allclose(lp, ref_log_probs, 1e-5, 1e-5)) << what << " log-probs differ by "
                                                                         << (lp - ref_log_probs).abs().max();
          }
          expect_same_step(parallel_step(HeadKind::kLanguageModel, policy_loss, tp, dp), policy_ref, what + " policy");
          expect_same_step(parallel_step(HeadKind::kValue, value_loss, tp, dp), value_ref, what + " value");
        }
      },
      120);
}

// Without the sum of the ranks' q_norm / k_norm gradients, each rank would step its norms with its own heads'
// share and the replicas would drift apart.
TEST(TensorParallelTraining, Qwen3HeadNormsTrainAsOnOneProcess) {
  run_ranks(
      4,
      [](int rank, int port) {
        ProcessGroup world = gloo_world(rank, 4, port);
        const ModelConfig config = qwen3_tensor_parallel_test_config();
        const StepResult want = reference_step(HeadKind::kLanguageModel, policy_loss, config);
        ASSERT_TRUE(want.grads.count("model.layers.0.self_attn.q_norm.weight"));
        ASSERT_GT(want.grads.at("model.layers.0.self_attn.k_norm.weight").abs().max().item<double>(), 0.0);
        for (int tp_size : {2, 4}) {
          DeviceMesh mesh(1, 4 / tp_size, tp_size);
          Communicator tp(world.split(mesh.tp_groups()));
          Communicator dp(world.split(mesh.dp_groups()));
          expect_same_step(parallel_step(HeadKind::kLanguageModel, policy_loss, tp, dp, config), want,
                           "qwen3 layout " + mesh.to_string());
        }
      },
      120);
}

TEST(TensorParallelTraining, GreedyGenerationUnderTensorParallelismMatchesOneProcess) {
  run_ranks(
      4,
      [](int rank, int port) {
        ProcessGroup world = gloo_world(rank, 4, port);
        GenerationConfig cfg;
        cfg.greedy = true;
        cfg.max_new_tokens = 8;
        const std::vector<std::vector<int64_t>> prompts = {{3, 17, 42}, {5}, {60, 1, 2, 9, 33}};
        CausalLM reference = reference_model(HeadKind::kLanguageModel, 5);
        const auto want = generate(reference, prompts, cfg);
        for (int tp_size : {2, 4}) {
          DeviceMesh mesh(1, 4 / tp_size, tp_size);
          Communicator tp(world.split(mesh.tp_groups()));
          CausalLM split(tensor_parallel_test_config(), HeadKind::kLanguageModel, TensorParallelGroup(&tp));
          load_full_state(*split, parameters_of(*reference));
          const auto got = generate(split, prompts, cfg);
          EXPECT_TRUE(torch::equal(got.responses, want.responses)) << "tp=" << tp_size << "\n"
                                                                   << got.responses << "\n" << want.responses;
          EXPECT_TRUE(torch::allclose(got.log_probs, want.log_probs, 1e-5, 1e-5)) << "tp=" << tp_size;
        }
      },
      60);
}

TEST(TensorParallelTraining, ModelsThatDoNotSplitAreRejectedNamingTheKey) {
  ModelConfig c = tensor_parallel_test_config();
  c.num_attention_heads = 6;
  c.num_key_value_heads = 3;
  c.hidden_size = 48;
  try {
    check_tensor_parallel(c, 4);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("num_attention_heads = 6"), std::string::npos) << e.what();
  }
  c = tensor_parallel_test_config();
  c.vocab_size = 66;
  EXPECT_THROW(check_tensor_parallel(c, 4), Error);
  EXPECT_NO_THROW(check_tensor_parallel(tensor_parallel_test_config(), 4));
}

}  // namespace
}  // namespace hybridflow
