// Expert parallelism inside pipeline stages (Megatron's layout): each stage holds its layers, and within a stage
// the MoE layers' experts split over the stage's data-parallel replicas (of the same tensor-parallel rank), whose
// tokens are exchanged inside the stage. A tiny Qwen3-MoE of 2 sparse layers (one per stage, 4 experts) at EP 2 x
// PP 2 (4 processes) and EP 2 x PP 2 x TP 2 (8) gives one process's logits, loss and gradients within 1e-5, and a
// TrainEngine step through the 1F1B schedule takes one process's step (loss, gradient norm, weights). With the
// experts gathered, generation through the stages runs alone per replica (no exchange) and gives one process's
// tokens. Every rank runs in a forked process over Gloo.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "engine/expert_parallel_fixture.h"
#include "hybridflow/engine/generation.h"
#include "hybridflow/engine/pipeline.h"
#include "hybridflow/parallel/device_mesh.h"
#include "parallel/rank_processes.h"

namespace hybridflow {
namespace {

using namespace hybridflow::testing;

// ep replicas of pp stages of tp ranks; the data-parallel group of a stage is its expert-parallel group.
struct ExpertPipelineRank {
  ExpertPipelineRank(int rank, int port, int ep, int pp, int tp)
      : world(gloo_world(rank, ep * pp * tp, port)),
        mesh(pp, ep, tp),
        tp(world.split(mesh.tp_groups())),
        dp(world.split(mesh.dp_groups())),
        stages(world.split(mesh.pp_groups())),
        model(expert_parallel_config(), HeadKind::kLanguageModel, TensorParallelGroup(&this->tp),
              PipelineStage{this->stages.rank(), pp}) {
    load_full_state(*model, parameters_of(*expert_model()));
    model->set_expert_parallel(ExpertParallelGroup(&dp));
  }
  bool last() const { return model->pipeline_stage().last(); }
  ProcessGroup world;
  DeviceMesh mesh;
  Communicator tp, dp, stages;
  CausalLM model;
};

std::string layout_name(int ep, int pp, int tp) {
  return "ep " + std::to_string(ep) + " x pp " + std::to_string(pp) + " x tp " + std::to_string(tp);
}

void check_logits_loss_and_gradients(int ep, int pp, int tp) {
  run_ranks(
      ep * pp * tp,
      [=](int rank, int port) {
        ExpertPipelineRank r(rank, port, ep, pp, tp);
        const std::string what = layout_name(ep, pp, tp);
        // This stage's one layer holds 4 / ep experts; the other stage's layer is not here.
        const int stage = r.stages.rank(), per_rank = 4 / ep;
        const std::string own = "model.layers." + std::to_string(stage) + ".mlp.experts." +
                                std::to_string(r.dp.rank() * per_rank) + ".up_proj.weight";
        EXPECT_TRUE(r.model->named_parameters().contains(own)) << what << ": " << own;
        EXPECT_FALSE(r.model->named_parameters().contains("model.layers." + std::to_string(1 - stage) +
                                                          ".mlp.gate.weight"))
            << what;

        CausalLM whole = expert_model();
        const DataProto all = rl_batch(), mine = rows_of(r.dp.rank(), ep);
        PipelineStageRunner runner(r.model, r.stages);
        {
          torch::NoGradGuard no_grad;
          const auto logits = pipeline_forward(runner, mine, mine.batch_size(), [&](const DataProto& m) {
            return r.model->forward(m.tensor("input_ids"), m.tensor("attention_mask")).logits;
          });
          if (r.last()) {
            const int64_t width = expert_parallel_config().vocab_size / tp;
            const auto want = whole->forward(mine.tensor("input_ids"), mine.tensor("attention_mask"))
                                  .logits.narrow(-1, r.tp.rank() * width, width);
            ASSERT_TRUE(logits.defined()) << what;
            EXPECT_TRUE(torch::allclose(logits, want, 1e-5, 1e-5))
                << what << ": logits differ by " << (logits - want).abs().max().item<double>();
          }
        }

        const double tokens = all.tensor("loss_mask").sum().item<double>();
        auto want_loss = globally_weighted_loss(whole, all, tokens);
        want_loss.backward();
        const StagePass pass = runner.forward(mine, /*training=*/true, [&](const DataProto& m) {
          return globally_weighted_loss(r.model, m, tokens);
        });
        runner.backward(pass);
        runner.wait_sends();
        if (r.last()) {
          auto summed = pass.output.detach().clone();
          r.dp.all_reduce(summed, ReduceOp::kSum);
          EXPECT_NEAR(summed.item<double>(), want_loss.item<double>(), 1e-5) << what;
        }
        // Replicated weights: the replicas' gradients add up (data parallelism); experts: already whole.
        for (auto& item : r.model->named_parameters())
          if (!is_expert(item.key()) && item.value().grad().defined()) r.dp.all_reduce(item.value().mutable_grad());
        expect_same_tensors(gather_full_grads(*r.model), held(grads_by_name(*whole), *r.model), 1e-5,
                            what + " gradients");
        // The exchanges ran inside the stage, forward and backward.
        EXPECT_GE(r.dp.stats().of("all_to_all").calls, 4) << what;
      },
      240);
}

void check_train_step(int ep, int pp, int tp) {
  run_ranks(
      ep * pp * tp,
      [=](int rank, int port) {
        const StepResult want = one_process_step(expert_model(), policy_loss);
        ExpertPipelineRank r(rank, port, ep, pp, tp);
        const std::string what = layout_name(ep, pp, tp);
        const ModelConfig config = expert_parallel_config();
        TrainEngine engine(r.model.ptr(), parallel_test_optimizer());
        engine.set_tensor_parallel(TensorParallelGroup(&r.tp), [&](const std::string& name) {
          return shard_dim(name, config, tp) != ShardDim::kReplicated;
        });
        engine.set_gradient_reducer([&](torch::Tensor& t) { r.dp.all_reduce(t, ReduceOp::kSum); });
        engine.set_pipeline(std::make_shared<PipelineStageRunner>(r.model, r.stages));
        engine.set_expert_parallel(ExpertParallelGroup(&r.dp), nullptr, is_expert);
        // One row per micro-batch: 4 / ep micro-batches through the 1F1B schedule.
        const StepStats stats = engine.train_step(rows_of(r.dp.rank(), ep), 1, [&](const DataProto& m) {
          return policy_loss(r.model, m);
        });
        expect_one_process_step(stats, want, *r.model, what);
      },
      240);
}

TEST(ExpertPipelineParallel, TwoWaysInTwoStagesLogitsLossAndGradientsEqualOneProcess) {
  check_logits_loss_and_gradients(2, 2, 1);
}

TEST(ExpertPipelineParallel, TwoWaysInTwoStagesTrainStepEqualsOneProcess) { check_train_step(2, 2, 1); }

// Expert, pipeline and tensor parallelism together: 8 processes.
TEST(ExpertPipelineParallel, WithTensorParallelismLogitsLossGradientsAndTrainStepEqualOneProcess) {
  check_logits_loss_and_gradients(2, 2, 2);
  check_train_step(2, 2, 2);
}

// The rollout's layout with the experts gathered: each replica generates its own prompts through its stages,
// exchanging nothing with the other, and gets one process's greedy tokens.
TEST(ExpertPipelineParallel, GatheredExpertsGenerateThroughTheStagesAlone) {
  run_ranks(4, [](int rank, int port) {
    ExpertPipelineRank r(rank, port, 2, 2, 1);
    CausalLM whole = expert_model();
    r.model->gather_experts();
    const auto calls = r.dp.stats().of("all_to_all").calls;
    // Replicas of different prompts (and lengths).
    using Prompts = std::vector<std::vector<int64_t>>;
    const Prompts prompts = r.dp.rank() == 0 ? Prompts{{3, 17, 42}, {5}} : Prompts{{60, 1, 2, 9, 33}};
    GenerationConfig cfg;
    cfg.max_new_tokens = 6;
    cfg.greedy = true;
    const GenerationOutput got = generate(r.model, prompts, cfg, &r.stages);
    const GenerationOutput want = generate(whole, prompts, cfg);
    EXPECT_TRUE(torch::equal(got.responses, want.responses));
    EXPECT_TRUE(torch::allclose(got.log_probs, want.log_probs, 1e-5, 1e-5));
    EXPECT_EQ(r.dp.stats().of("all_to_all").calls, calls);
    r.model->release_gathered_experts();
  });
}

}  // namespace
}  // namespace hybridflow
