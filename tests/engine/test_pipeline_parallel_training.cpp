// Pipeline parallelism (with tensor and data parallelism) against one process: for layouts p x t x d =
// 2x2x1, 2x1x2 and 4x1x1 on 4 processes, with untied and tied embeddings, one PPO policy step and one value
// step through the 1F1B schedule give the single-process loss, gradient norm, gradients and updated
// weights on every stage (the policy step with the ZeRO optimizer too, where d > 1), and log-prob
// inference through the stages gives the single-process log-probs.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "engine/tensor_parallel_fixture.h"
#include "hybridflow/engine/generation.h"
#include "hybridflow/engine/pipeline.h"
#include "hybridflow/engine/train_engine.h"
#include "hybridflow/parallel/device_mesh.h"
#include "parallel/rank_processes.h"
#include "support/error_of.h"

namespace hybridflow {
namespace {

using namespace hybridflow::testing;

struct Layout {
  int pp, tp, dp;
  bool tied;
  std::string name() const {
    return std::to_string(pp) + "x" + std::to_string(tp) + "x" + std::to_string(dp) + (tied ? " tied" : "");
  }
};

ModelConfig pipeline_test_config(bool tied) {
  ModelConfig c = tensor_parallel_test_config();
  c.num_hidden_layers = 4;
  c.tie_word_embeddings = tied;
  return c;
}

CausalLM whole_model(bool tied, HeadKind head) {
  torch::manual_seed(1234);
  return CausalLM(pipeline_test_config(tied), head);
}

StepResult reference_step(bool tied, HeadKind head, ModelLossFn loss) {
  return one_process_step(whole_model(tied, head), loss);
}

// The groups of one layout over the 4-process world.
struct Groups {
  Groups(const ProcessGroup& world, const DeviceMesh& mesh)
      : tp(world.split(mesh.tp_groups())), dp(world.split(mesh.dp_groups())), pp(world.split(mesh.pp_groups())) {}
  Communicator tp, dp, pp;
};

CausalLM stage_model(const Layout& layout, HeadKind head, Groups& g) {
  const ModelConfig config = pipeline_test_config(layout.tied);
  CausalLM model(config, head, TensorParallelGroup(&g.tp), PipelineStage{g.pp.rank(), layout.pp});
  load_full_state(*model, parameters_of(*whole_model(layout.tied, head)));
  return model;
}

// sharded: the data-parallel ranks of a stage partition the optimizer state (ZeRO-1) instead of reducing
// whole gradients; the parameters' own gradients then stay local and are not compared.
StepResult pipeline_step(const Layout& layout, HeadKind head, ModelLossFn loss, Groups& g, bool sharded = false) {
  CausalLM model = stage_model(layout, head, g);
  const ModelConfig config = model->config();
  TrainEngine engine(model.ptr(), parallel_test_optimizer());
  engine.set_tensor_parallel(TensorParallelGroup(&g.tp), [&](const std::string& name) {
    return shard_dim(name, config, g.tp.size()) != ShardDim::kReplicated;
  });
  if (g.dp.size() > 1 && !sharded) engine.set_gradient_reducer([&g](torch::Tensor& flat) { g.dp.all_reduce(flat); });
  auto runner = std::make_shared<PipelineStageRunner>(model, g.pp);
  engine.set_pipeline(runner);
  if (sharded) engine.set_sharded_optimizer(g.dp);
  const DataProto batch = rl_batch();
  const int64_t rows = batch.batch_size() / g.dp.size();
  StepResult r;
  // One row per micro-batch: 4 (d=1) or 2 (d=2) micro-batches through the 1F1B schedule.
  r.stats = engine.train_step(batch.slice(g.dp.rank() * rows, (g.dp.rank() + 1) * rows), 1,
                              [&](const DataProto& m) { return loss(model, m); });
  r.grads = gather_full_grads(*model);
  r.weights = gather_full_state(*model);
  // 1F1B keeps at most (stages after this one) + 1 activations in flight, not one per micro-batch (4 at d=1).
  const int after = layout.pp - 1 - g.pp.rank();
  EXPECT_LE(runner->peak_activation_sends(), static_cast<size_t>(after > 0 ? after + 1 : 0)) << layout.name();
  return r;
}

// The reference's tensors that this stage holds.
std::map<std::string, torch::Tensor> held(const std::map<std::string, torch::Tensor>& all,
                                          const std::map<std::string, torch::Tensor>& stage) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& [name, value] : stage) out[name] = all.at(name);
  return out;
}

void expect_same_step(const StepResult& got, const StepResult& want, const std::string& what,
                      bool compare_grads = true) {
  EXPECT_NEAR(got.stats.loss, want.stats.loss, 1e-5) << what;
  EXPECT_NEAR(got.stats.grad_norm, want.stats.grad_norm, 1e-5 * want.stats.grad_norm) << what;
  EXPECT_EQ(got.stats.tokens, want.stats.tokens) << what;
  if (compare_grads) expect_same_tensors(got.grads, held(want.grads, got.grads), 2e-6, what + " gradients");
  expect_same_tensors(got.weights, held(want.weights, got.weights), 2e-6, what + " updated weights");
}

TEST(PipelineParallelTraining, LayoutsOnFourProcessesMatchOneProcess) {
  run_ranks(
      4,
      [](int rank, int port) {
        ProcessGroup world = gloo_world(rank, 4, port);
        const DataProto batch = rl_batch();
        for (const Layout& layout : {Layout{2, 2, 1, false}, Layout{2, 1, 2, false}, Layout{2, 1, 2, true},
                                     Layout{4, 1, 1, true}}) {
          const std::string what = "layout " + layout.name();
          DeviceMesh mesh(layout.pp, layout.dp, layout.tp);
          Groups groups(world, mesh);

          const StepResult policy_ref = reference_step(layout.tied, HeadKind::kLanguageModel, policy_loss);
          ASSERT_GT(policy_ref.stats.grad_norm, parallel_test_optimizer().grad_clip)
            << "the test should exercise clipping";
          expect_same_step(pipeline_step(layout, HeadKind::kLanguageModel, policy_loss, groups), policy_ref,
                           what + " policy");
          // ZeRO-1 over each stage's data-parallel ranks: the clipped norm spans the stages and counts a
          // tied embedding once, so the step is the same.
          if (layout.dp > 1)
            expect_same_step(pipeline_step(layout, HeadKind::kLanguageModel, policy_loss, groups, true), policy_ref,
                             what + " policy with ZeRO", /*compare_grads=*/false);
          const StepResult value_ref = reference_step(layout.tied, HeadKind::kValue, value_loss);
          expect_same_step(pipeline_step(layout, HeadKind::kValue, value_loss, groups), value_ref, what + " value");

          // Log-prob inference: every row through the stages, two rows per micro-batch.
          CausalLM reference = whole_model(layout.tied, HeadKind::kLanguageModel);
          CausalLM stage = stage_model(layout, HeadKind::kLanguageModel, groups);
          PipelineStageRunner runner(stage, groups.pp);
          torch::NoGradGuard no_grad;
          auto log_probs_of = [](CausalLM& model) {
            return [&model](const DataProto& m) {
              return response_log_probs(model, m.tensor("input_ids"), m.tensor("attention_mask"), kResponseLen)
                  .log_probs;
            };
          };
          const torch::Tensor want = log_probs_of(reference)(batch);
          const torch::Tensor got = pipeline_forward(runner, batch, 2, log_probs_of(stage));
          if (groups.pp.rank() == layout.pp - 1) {
            ASSERT_TRUE(got.defined()) << what;
            EXPECT_TRUE(torch::allclose(got, want, 1e-5, 1e-5)) << what << " log-probs differ by "
                                                                << (got - want).abs().max();
          } else {
            EXPECT_FALSE(got.defined()) << what << ": only the last stage has the outputs";
          }
        }
      },
      180);
}

TEST(PipelineParallelTraining, GenerationOnAStageWithoutItsStagesSaysWhatItNeeds) {
  CausalLM stage(pipeline_test_config(false), HeadKind::kLanguageModel, TensorParallelGroup{}, PipelineStage{0, 2});
  GenerationConfig cfg;
  cfg.greedy = true;
  const std::string e = error_of([&] { generate(stage, {{1, 2, 3}}, cfg); });
  EXPECT_NE(e.find("the model is pipeline stage 0 of 2 and needs the communicator over its stages"), std::string::npos)
      << e;
}

// Generation through the stages: the hidden states of each step travel stage to stage and the last stage
// samples. Without tensor parallelism the logits are one process's bit for bit, so sampled tokens (rows
// finishing at eos at different steps) are too; with it, greedy tokens are.
TEST(PipelineParallelTraining, GenerationThroughTheStagesMatchesOneProcess) {
  run_ranks(
      4,
      [](int rank, int port) {
        ProcessGroup world = gloo_world(rank, 4, port);
        for (const Layout& layout : {Layout{2, 2, 1, false}, Layout{2, 1, 2, true}, Layout{4, 1, 1, false}}) {
          const std::string what = "layout " + layout.name();
          Groups groups(world, DeviceMesh(layout.pp, layout.dp, layout.tp));
          CausalLM stage = stage_model(layout, HeadKind::kLanguageModel, groups);
          CausalLM reference = whole_model(layout.tied, HeadKind::kLanguageModel);
          const std::vector<std::vector<int64_t>> prompts = {{3, 17, 42}, {5}, {60, 1, 2, 9, 33}};
          GenerationConfig cfg;
          cfg.max_new_tokens = 8;
          cfg.greedy = true;
          GenerationOutput got = generate(stage, prompts, cfg, &groups.pp);
          GenerationOutput want = generate(reference, prompts, cfg);
          EXPECT_TRUE(torch::equal(got.responses, want.responses)) << what << " greedy";
          EXPECT_TRUE(torch::allclose(got.log_probs, want.log_probs, 1e-5, 1e-5)) << what << " greedy log-probs";
          // Prefix caching through the stages: the second prompt starts on the first one's 2 blocks of 2 on every
          // stage (each stage's cache holds its own layers), and generates what one process does.
          GenerationConfig alike_cfg = cfg;
          alike_cfg.kv_block_size = 2;
          const std::vector<std::vector<int64_t>> alike = {{60, 1, 2, 9, 33}, {60, 1, 2, 9, 34}, {5}};
          got = generate(stage, alike, alike_cfg, &groups.pp);
          want = generate(reference, alike, alike_cfg);
          EXPECT_EQ(got.kv_cache.prefix_cached_tokens, 4) << what;
          EXPECT_EQ(want.kv_cache.prefix_cached_tokens, 4) << what;
          EXPECT_TRUE(torch::equal(got.responses, want.responses)) << what << " prefix caching";
          EXPECT_TRUE(torch::allclose(got.log_probs, want.log_probs, 1e-5, 1e-5)) << what << " prefix caching log-probs";
          if (layout.tp > 1) continue;
          cfg.greedy = false;
          cfg.n = 3;
          cfg.seed = 11;
          cfg.eos_token_ids = {7};
          cfg.max_new_tokens = 24;
          got = generate(stage, prompts, cfg, &groups.pp);
          want = generate(reference, prompts, cfg);
          EXPECT_TRUE(torch::equal(got.responses, want.responses)) << what << " sampled";
          EXPECT_TRUE(torch::equal(got.response_mask, want.response_mask)) << what << " sampled";
          EXPECT_TRUE(torch::equal(got.log_probs, want.log_probs)) << what << " sampled log-probs";
          const torch::Tensor lengths = want.response_mask.sum(1);
          EXPECT_LT(lengths.min().item<int64_t>(), lengths.max().item<int64_t>()) << what << ": rows should end apart";
        }
      },
      120);
}

}  // namespace
}  // namespace hybridflow
