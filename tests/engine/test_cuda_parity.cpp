// The CUDA build on a GPU computes what the CPU computes: forward passes, response log-probs, cached and
// uncached generation, a training step (fp32 and bf16 with fp32 masters) and an NCCL collective. Every test
// skips where no CUDA device is visible (CI, a CPU build); scripts/gpu_check.sh runs them on a GPU machine.
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <string>

#include "hybridflow/engine/generation.h"
#include "hybridflow/engine/model_log_probs.h"
#include "hybridflow/engine/train_engine.h"
#include "hybridflow/parallel/collectives.h"
#include "hybridflow/parallel/process_group.h"
#include "support/tiny_model.h"

namespace hybridflow {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device visible (CPU build or no GPU)"

ModelConfig small_config() {
  return testing::tiny_model_config({.vocab_size = 97, .hidden_size = 64, .intermediate_size = 128}, "qwen2-tiny");
}

// The same weights on the CPU and on the GPU: the GPU model is loaded from the CPU one's state.
struct ModelPair {
  CausalLM cpu{nullptr}, gpu{nullptr};
};

ModelPair make_pair(torch::Dtype dtype = torch::kFloat32, double weight_scale = 1.0) {
  torch::manual_seed(5);
  ModelPair p;
  p.cpu = CausalLM(small_config());
  torch::NoGradGuard no_grad;
  if (weight_scale != 1.0)
    for (auto& w : p.cpu->parameters())
      if (w.dim() == 2) w.mul_(weight_scale);  // spread logits so greedy choices are not near ties
  p.gpu = CausalLM(small_config());
  auto src = p.cpu->named_parameters();
  for (auto& item : p.gpu->named_parameters()) item.value().copy_(src[item.key()]);
  p.gpu->to(torch::Device(torch::kCUDA), dtype);
  if (dtype != torch::kFloat32) p.cpu->to(dtype);
  return p;
}

torch::Tensor batch_ids() {
  torch::manual_seed(3);
  return torch::randint(1, 97, {3, 12}, torch::kLong);
}

torch::Tensor left_padded_mask() {
  auto mask = torch::ones({3, 12}, torch::kLong);
  mask[1].slice(0, 0, 4).zero_();  // row 1 is left-padded by 4
  return mask;
}

TEST(CudaParity, ForwardLogitsMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  ModelPair p = make_pair();
  torch::NoGradGuard no_grad;
  const auto ids = batch_ids(), mask = left_padded_mask();
  auto cpu = p.cpu->forward(ids, mask).logits;
  auto gpu = p.gpu->forward(ids.cuda(), mask.cuda()).logits.cpu();
  const auto real = mask.to(torch::kBool).unsqueeze(-1).expand_as(cpu);
  EXPECT_TRUE(torch::allclose(cpu.masked_select(real), gpu.masked_select(real), 1e-4, 1e-4))
      << "max |diff| " << (cpu - gpu).abs().masked_select(real).max().item<double>();
}

TEST(CudaParity, ResponseLogProbsAndEntropyMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  ModelPair p = make_pair();
  torch::NoGradGuard no_grad;
  const auto ids = batch_ids(), mask = left_padded_mask();
  auto cpu = response_log_probs(p.cpu, ids, mask, 5, 0.7, true);
  auto gpu = response_log_probs(p.gpu, ids.cuda(), mask.cuda(), 5, 0.7, true);
  EXPECT_TRUE(torch::allclose(cpu.log_probs, gpu.log_probs.cpu(), 1e-4, 1e-4));
  EXPECT_TRUE(torch::allclose(cpu.entropy, gpu.entropy.cpu(), 1e-4, 1e-4));
}

TEST(CudaParity, GreedyGenerationMatchesTheCpuAndCachedMatchesRecompute) {
  SKIP_WITHOUT_GPU();
  ModelPair p = make_pair(torch::kFloat32, 8.0);
  const std::vector<std::vector<int64_t>> prompts = {{5, 9, 2, 30, 7}, {1, 12}, {40, 3, 3}};
  GenerationConfig cfg;
  cfg.greedy = true;
  cfg.max_new_tokens = 10;
  cfg.n = 2;
  auto cpu = generate(p.cpu, prompts, cfg);
  auto gpu = generate(p.gpu, prompts, cfg);
  ASSERT_TRUE(gpu.responses.is_cuda());
  EXPECT_TRUE(torch::equal(cpu.responses, gpu.responses.cpu()));
  EXPECT_TRUE(torch::allclose(cpu.log_probs, gpu.log_probs.cpu(), 1e-4, 1e-4));
  cfg.use_kv_cache = false;
  auto recompute = generate(p.gpu, prompts, cfg);
  EXPECT_TRUE(torch::equal(recompute.responses, gpu.responses));
}

// Decode steps replayed as CUDA graphs (GenerationConfig::cuda_graphs) choose the eager steps' greedy tokens:
// prompts of several lengths, two samples each, fewer slots than sequences (rows join and leave), blocks of 4
// positions (spans cross several buckets), in fp32 and bf16; the graphs attend over padded spans, so the
// log-probs agree to rounding.
TEST(CudaParity, DecodeGraphsChooseTheEagerStepsTokens) {
  SKIP_WITHOUT_GPU();
  for (torch::Dtype dtype : {torch::kFloat32, torch::kBFloat16}) {
    ModelPair p = make_pair(dtype, 8.0);
    const std::vector<std::vector<int64_t>> prompts = {
        {5, 9, 2, 30, 7}, {1, 12}, {40, 3, 3}, {8, 8, 1, 2, 3, 4, 5, 6, 7}};
    GenerationConfig cfg;
    cfg.greedy = true;
    cfg.max_new_tokens = 40;
    cfg.n = 2;
    cfg.max_num_seqs = 6;
    cfg.kv_block_size = 4;
    auto eager = generate(p.gpu, prompts, cfg);
    EXPECT_EQ(eager.decode_graphs, 0);
    cfg.cuda_graphs = true;
    auto graphs = generate(p.gpu, prompts, cfg);
    const std::string what = dtype == torch::kFloat32 ? "fp32" : "bf16";
    EXPECT_GT(graphs.decode_graphs, 1) << what;
    EXPECT_GT(graphs.graph_steps, 30) << what;
    EXPECT_TRUE(torch::equal(graphs.responses, eager.responses)) << what;
    EXPECT_TRUE(torch::allclose(graphs.log_probs, eager.log_probs, 1e-3, dtype == torch::kFloat32 ? 1e-4 : 5e-2))
        << what << " max diff " << (graphs.log_probs - eager.log_probs).abs().max().item<float>();
    // A second call captures its own graphs and gives the same tokens again.
    auto again = generate(p.gpu, prompts, cfg);
    EXPECT_TRUE(torch::equal(again.responses, graphs.responses)) << what;
  }
}

// Decode steps read back in chunks (GenerationConfig::readback_interval): sampling, eos checks and the
// finished-row mask stay on the GPU for 8 steps, eagerly and through the CUDA graphs, and the tokens are the
// ones read back after every step; rows join and leave (fewer slots than sequences), eos and max_new_tokens
// fall inside chunks. Rows that ended keep their batch places until a chunk ends, so the matmuls may round
// differently: log-probs agree to rounding.
TEST(CudaParity, ChunkedReadBackChoosesTheTokensOfEveryStepReadBack) {
  SKIP_WITHOUT_GPU();
  ModelPair p = make_pair(torch::kFloat32, 8.0);
  const std::vector<std::vector<int64_t>> prompts = {{5, 9, 2, 30, 7}, {1, 12}, {40, 3, 3}, {8, 8, 1, 2, 3, 4}};
  for (bool graphs : {false, true})
    for (bool greedy : {true, false}) {
      GenerationConfig cfg;
      cfg.greedy = greedy;
      cfg.temperature = 1.2;
      cfg.top_p = 0.95;
      cfg.seed = 31;
      cfg.max_new_tokens = 29;
      cfg.n = 2;
      cfg.max_num_seqs = 4;
      cfg.kv_block_size = 4;
      cfg.eos_token_ids = {3, 4, 5};
      cfg.cuda_graphs = graphs;
      const std::string what = std::string(graphs ? "graphs" : "eager") + (greedy ? ", greedy" : ", sampled");
      const GenerationOutput every_step = generate(p.gpu, prompts, cfg);
      cfg.readback_interval = 8;
      const GenerationOutput chunked = generate(p.gpu, prompts, cfg);
      EXPECT_TRUE(torch::equal(chunked.responses, every_step.responses)) << what;
      EXPECT_TRUE(torch::equal(chunked.response_mask, every_step.response_mask)) << what;
      EXPECT_TRUE(torch::allclose(chunked.log_probs, every_step.log_probs, 1e-4, 1e-5)) << what;
      EXPECT_LT(chunked.host_syncs, every_step.host_syncs) << what;
      if (graphs) {
        EXPECT_GT(chunked.graph_steps, 0) << what;
      }
    }
}

TEST(CudaParity, SeededSamplingOnTheGpuIsReproducibleAndStopsAtEos) {
  SKIP_WITHOUT_GPU();
  ModelPair p = make_pair();
  GenerationConfig cfg;
  cfg.max_new_tokens = 16;
  cfg.temperature = 1.0;
  cfg.top_p = 0.9;
  cfg.n = 4;
  cfg.seed = 77;
  cfg.eos_token_ids = {3, 4, 5, 6, 7, 8};
  auto a = generate(p.gpu, {{10, 11, 12}, {20, 21}}, cfg);
  auto b = generate(p.gpu, {{10, 11, 12}, {20, 21}}, cfg);
  EXPECT_TRUE(torch::equal(a.responses, b.responses));
  EXPECT_TRUE(torch::equal(a.log_probs, b.log_probs));
  // After a row's eos nothing is generated: the mask is a prefix of ones ending at the eos.
  auto mask = a.response_mask.cpu();
  auto tokens = a.responses.cpu();
  for (int64_t r = 0; r < mask.size(0); ++r) {
    const int64_t len = mask[r].sum().item<int64_t>();
    EXPECT_TRUE(torch::equal(mask[r].slice(0, 0, len), torch::ones({len}, torch::kLong)));
    for (int64_t t = 0; t + 1 < len; ++t) EXPECT_TRUE(tokens[r][t].item<int64_t>() < 3 || tokens[r][t].item<int64_t>() > 8);
  }
}

// One AdamW step with the engine: the GPU's parameters end where the CPU's do.
void expect_training_step_matches(torch::Dtype dtype, double tolerance) {
  ModelPair p = make_pair(dtype);
  const auto ids = batch_ids(), mask = left_padded_mask();
  auto loss_for = [](CausalLM model) {
    return [model](const DataProto& b) mutable {
      auto logits = model->forward(b.tensor("input_ids"), b.tensor("attention_mask")).logits.to(torch::kFloat32);
      auto lp = torch::log_softmax(logits.slice(1, 0, -1), -1)
                    .gather(-1, b.tensor("input_ids").slice(1, 1).unsqueeze(-1))
                    .squeeze(-1);
      auto m = b.tensor("loss_mask").to(torch::kFloat32);
      return -(lp * m).sum() / m.sum();
    };
  };
  auto batch_on = [&](torch::Device d) {
    DataProto b;
    b.set_tensor("input_ids", ids.to(d));
    b.set_tensor("attention_mask", mask.to(d));
    b.set_tensor("loss_mask", mask.slice(1, 1).to(d));
    return b;
  };
  OptimizerOptions o;
  o.schedule.lr = 1e-2;
  TrainEngine cpu_engine(p.cpu.ptr(), o), gpu_engine(p.gpu.ptr(), o);
  auto cpu_stats = cpu_engine.train_step(batch_on(torch::kCPU), 2, loss_for(p.cpu));
  auto gpu_stats = gpu_engine.train_step(batch_on(torch::kCUDA), 2, loss_for(p.gpu));
  EXPECT_NEAR(cpu_stats.loss, gpu_stats.loss, tolerance * std::abs(cpu_stats.loss));
  EXPECT_NEAR(cpu_stats.grad_norm, gpu_stats.grad_norm, 10 * tolerance * cpu_stats.grad_norm);
  auto cpu_params = p.cpu->named_parameters();
  double worst = 0;
  for (auto& item : p.gpu->named_parameters())
    worst = std::max(worst, (item.value().cpu().to(torch::kFloat32) - cpu_params[item.key()].to(torch::kFloat32))
                                .abs().max().item<double>());
  EXPECT_LT(worst, 10 * tolerance) << "largest parameter difference after one step";
}

TEST(CudaParity, Fp32TrainingStepMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  expect_training_step_matches(torch::kFloat32, 1e-4);
}

TEST(CudaParity, Bf16TrainingStepWithFp32MastersMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  expect_training_step_matches(torch::kBFloat16, 2e-2);
}

TEST(CudaParity, NcclCollectivesOnOneRank) {
  SKIP_WITHOUT_GPU();
  LaunchEnv env;
  env.master_port = 29877;
  ProcessGroupOptions options;
  options.device = "cuda";
  Communicator comm(ProcessGroup::create_world(env, options));
  EXPECT_EQ(comm.group().backend(), "nccl");
  auto t = torch::arange(8, torch::TensorOptions().dtype(torch::kFloat32).device(torch::kCUDA));
  comm.all_reduce(t);
  EXPECT_TRUE(torch::equal(t.cpu(), torch::arange(8, torch::kFloat32)));
  auto parts = comm.all_gather(t);
  ASSERT_EQ(parts.size(), 1u);
  EXPECT_TRUE(parts[0].is_cuda());
  comm.broadcast(t, 0);
  EXPECT_EQ(comm.stats().of("all_reduce").bytes, 8 * 4);
}

}  // namespace
}  // namespace hybridflow
