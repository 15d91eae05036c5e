// The CUDA build on a GPU computes what the CPU computes: forward passes, response log-probs, cached and
// uncached generation, a training step (fp32 and bf16 with fp32 masters) and an NCCL collective; the fused
// CUDA paths (model/cuda_fused.h: grouped expert GEMM, varlen flash attention) what the loops compute; and the
// fused decode kernels (kernels/decode_kernels.h) what the unfused operators and their CPU references do. Every test
// skips where no CUDA device is visible (CI, a CPU build); scripts/gpu_check.sh runs them on a GPU machine.
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "hybridflow/core/cuda_memory_history.h"
#include "hybridflow/core/error.h"
#include "hybridflow/engine/decode_graph_cache.h"
#include "hybridflow/engine/generation.h"
#include "hybridflow/engine/head_log_probs.h"
#include "hybridflow/engine/model_log_probs.h"
#include "hybridflow/engine/train_engine.h"
#include "hybridflow/engine/turn_batcher.h"
#include "hybridflow/kernels/decode_fusions.h"
#include "hybridflow/kernels/decode_kernels.h"
#include "hybridflow/kernels/few_rows_linear.h"
#include "hybridflow/model/cuda_fused.h"
#include "hybridflow/model/rms_norm.h"
#include "hybridflow/parallel/collectives.h"
#include "hybridflow/parallel/process_group.h"
#include "support/decode_fusion_oracles.h"
#include "support/decode_kernel_oracles.h"
#include "support/graph_draw_step.h"
#include "support/paged_generation_case.h"
#include "support/tiny_model.h"
#include "support/two_turns_each.h"

namespace hybridflow {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device visible (CPU build or no GPU)"

ModelConfig small_config() { return testing::paged_case_model_config(); }

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

// global_profiler.tool torch_memory: the recorded history reaches the snapshot, a pickle (protocol 2 or later
// starts with 0x80) holding the allocator's segments and the traces of the allocations made while recording.
TEST(CudaParity, MemoryHistorySnapshotHoldsTheRecordedAllocations) {
  SKIP_WITHOUT_GPU();
  ASSERT_TRUE(cuda_memory_history_built());
  start_cuda_memory_history({.max_entries = 1000, .context = "all", .stacks = "cpp"});
  torch::Tensor held = torch::empty({16, 1024, 1024}, torch::TensorOptions().device(torch::kCUDA));  // 64 MiB
  held.fill_(1.0f);
  torch::cuda::synchronize();
  const std::string snapshot = cuda_memory_snapshot();
  stop_cuda_memory_history();
  ASSERT_GT(snapshot.size(), 2u);
  EXPECT_EQ(static_cast<unsigned char>(snapshot[0]), 0x80);
  EXPECT_NE(snapshot.find("segments"), std::string::npos);
  EXPECT_NE(snapshot.find("device_traces"), std::string::npos);
  EXPECT_NE(snapshot.find("alloc"), std::string::npos) << "no allocation event recorded";
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

using testing::paged_greedy_config;
using testing::paged_prompts;

// Two greedy turns of every conversation through a TurnBatcher on `model` (turns of up to 6 and 4 ids), and the
// batcher's stats.
std::pair<std::vector<std::vector<BatchedTurn>>, TurnBatcherStats> two_greedy_turns(
    CausalLM& model, const GenerationConfig& cfg, const std::vector<std::vector<int64_t>>& prompts, int64_t group_size) {
  TurnBatcher batcher(model, cfg, static_cast<int64_t>(prompts.size()), group_size);
  auto turns = testing::two_turns_each(batcher, prompts, 6, 4);
  return {std::move(turns), batcher.stats()};
}

// Multi-turn continuous batching on the GPU (agentic rollouts): the turns the CPU generates from the same
// weights, delta prefills resumed from the cached blocks; and prefix caching across prompts (their first 2
// blocks alike) with and without groups choosing the tokens of prefix caching off, prefilling exactly the
// positions it found fewer.
TEST(CudaParity, MultiTurnBatchingMatchesTheCpuWithPrefixCachingOnAndOff) {
  SKIP_WITHOUT_GPU();
  ModelPair p = make_pair(torch::kFloat32, 8.0);
  const std::vector<int64_t> a = {5, 9, 2, 30, 21, 22, 23, 24, 33, 34}, b = {5, 9, 2, 30, 21, 22, 23, 24, 40};
  const std::vector<std::vector<int64_t>> prompts = {a, a, b, b};
  GenerationConfig cfg;
  cfg.greedy = true;
  cfg.max_new_tokens = 16;
  cfg.kv_block_size = 4;
  for (const int64_t group_size : {1, 2}) {
    SCOPED_TRACE(::testing::Message() << "group_size " << group_size);
    const auto [cpu, cpu_stats] = two_greedy_turns(p.cpu, cfg, prompts, group_size);
    const auto [gpu, gpu_stats] = two_greedy_turns(p.gpu, cfg, prompts, group_size);
    GenerationConfig off = cfg;
    off.enable_prefix_caching = false;
    const auto [gpu_off, gpu_off_stats] = two_greedy_turns(p.gpu, off, prompts, group_size);
    for (size_t c = 0; c < prompts.size(); ++c)
      for (size_t t = 0; t < 2; ++t) {
        ASSERT_EQ(gpu[c][t].ids, cpu[c][t].ids) << "conversation " << c << " turn " << t;
        ASSERT_EQ(gpu_off[c][t].ids, gpu[c][t].ids) << "conversation " << c << " turn " << t;
        for (size_t k = 0; k < gpu[c][t].log_probs.size(); ++k) {
          EXPECT_NEAR(gpu[c][t].log_probs[k], cpu[c][t].log_probs[k], 1e-4) << "conversation " << c;
          EXPECT_NEAR(gpu_off[c][t].log_probs[k], gpu[c][t].log_probs[k], 1e-4) << "conversation " << c;
        }
      }
    EXPECT_EQ(gpu_stats.prefix_cached_tokens, cpu_stats.prefix_cached_tokens);
    EXPECT_GE(gpu_stats.prefix_cached_tokens, 8);
    EXPECT_EQ(gpu_off_stats.prefill_tokens - gpu_stats.prefill_tokens, gpu_stats.prefix_cached_tokens);
    EXPECT_GT(gpu_stats.reused_tokens, gpu_stats.prefix_cached_tokens);  // the second turns' delta resumes
  }
}

// Decode steps replayed as CUDA graphs (GenerationConfig::cuda_graphs) choose the eager steps' greedy tokens:
// prompts of several lengths, two samples each, fewer slots than sequences (rows join and leave), blocks of 4
// positions (spans cross several buckets), in fp32 and bf16; the graphs attend over padded spans, so the
// log-probs agree to rounding.
TEST(CudaParity, DecodeGraphsChooseTheEagerStepsTokens) {
  SKIP_WITHOUT_GPU();
  for (torch::Dtype dtype : {torch::kFloat32, torch::kBFloat16}) {
    ModelPair p = make_pair(dtype, 8.0);
    const auto prompts = paged_prompts();
    GenerationConfig cfg = paged_greedy_config();
    auto eager = generate(p.gpu, prompts, cfg);
    EXPECT_EQ(eager.decode_graphs, 0);
    cfg.cuda_graphs = true;
    auto graphs = generate(p.gpu, prompts, cfg);
    const std::string what = dtype == torch::kFloat32 ? "fp32" : "bf16";
    EXPECT_GE(graphs.decode_graphs, 1) << what;  // few: a step replays a graph up to twice its bucket
    EXPECT_GT(graphs.graph_steps, 30) << what;
    EXPECT_TRUE(torch::equal(graphs.responses, eager.responses)) << what;
    EXPECT_TRUE(torch::allclose(graphs.log_probs, eager.log_probs, 1e-3, dtype == torch::kFloat32 ? 1e-4 : 5e-2))
        << what << " max diff " << (graphs.log_probs - eager.log_probs).abs().max().item<float>();
    // A second call captures its own graphs and gives the same tokens again.
    auto again = generate(p.gpu, prompts, cfg);
    EXPECT_TRUE(torch::equal(again.responses, graphs.responses)) << what;
  }
}

// Graphs kept from one call to the next (GenerationConfig::decode_graph_cache, the rollout worker's with
// free_cache_engine false): the second call replays the first's graphs on its pools and captures none for the
// same steps, a call with other prompts takes them too, and every call chooses the tokens of a call that
// captures its own graphs.
TEST(CudaParity, DecodeGraphsKeptAcrossCallsChooseTheSameTokens) {
  SKIP_WITHOUT_GPU();
  ModelPair p = make_pair(torch::kFloat32, 8.0);
  const auto prompts = paged_prompts();
  GenerationConfig cfg = paged_greedy_config();
  cfg.cuda_graphs = true;
  const GenerationOutput own = generate(p.gpu, prompts, cfg);
  cfg.decode_graph_cache = std::make_shared<DecodeGraphCache>();
  const GenerationOutput first = generate(p.gpu, prompts, cfg);
  EXPECT_EQ(first.decode_graphs_taken, 0);
  EXPECT_FALSE(first.kv_cache.kept_pools);
  ASSERT_GE(first.decode_graphs, 1);
  const GenerationOutput second = generate(p.gpu, prompts, cfg);
  EXPECT_TRUE(second.kv_cache.kept_pools);
  EXPECT_EQ(second.decode_graphs_taken, first.decode_graphs);
  EXPECT_EQ(second.decode_graphs, first.decode_graphs);  // nothing captured again
  EXPECT_EQ(second.graph_steps, first.graph_steps);
  for (const auto* out : {&first, &second}) {
    EXPECT_TRUE(torch::equal(out->responses, own.responses));
    EXPECT_TRUE(torch::allclose(out->log_probs, own.log_probs, 1e-3, 1e-4));
  }
  // Fewer, shorter prompts: within what the kept set holds.
  const std::vector<std::vector<int64_t>> fewer(prompts.begin(), prompts.begin() + 2);
  cfg.decode_graph_cache->clear();
  const GenerationOutput fresh = generate(p.gpu, fewer, cfg);
  generate(p.gpu, prompts, cfg);  // the larger call's set, kept
  const GenerationOutput taken = generate(p.gpu, fewer, cfg);
  EXPECT_TRUE(taken.kv_cache.kept_pools);
  EXPECT_GT(taken.decode_graphs_taken, 0);
  EXPECT_TRUE(torch::equal(taken.responses, fresh.responses));
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
      GenerationConfig cfg = testing::readback_parity_config(greedy);
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

// Sampling inside the decode graphs: the step a drawing graph captures (the paged decode from static buffers and
// the draw, nothing read back) chooses the eager step's tokens on the GPU, and generation through the graphs,
// where each step is one replay that also draws (temperature, top-k, top-p from the chunk's uniforms), read
// back every 8 steps, gives the tokens of the eager decode read back every step.
TEST(CudaParity, DecodeGraphsDrawTheEagerStepsTokensInsideTheGraph) {
  SKIP_WITHOUT_GPU();
  ModelPair p = make_pair(torch::kFloat32, 8.0);
  for (bool greedy : {true, false}) testing::expect_graph_draw_step_matches_eager(p.gpu, greedy, 1e-4);
  const std::vector<std::vector<int64_t>> prompts = {{5, 9, 2, 30, 7}, {1, 12}, {40, 3, 3}, {8, 8, 1, 2, 3, 4}};
  for (bool greedy : {true, false}) {
    GenerationConfig cfg = testing::readback_parity_config(greedy);
    cfg.top_k = 50;
    const std::string what = greedy ? "greedy" : "sampled";
    const GenerationOutput eager = generate(p.gpu, prompts, cfg);
    cfg.cuda_graphs = true;
    cfg.readback_interval = 8;
    const GenerationOutput graphs = generate(p.gpu, prompts, cfg);
    EXPECT_GT(graphs.decode_graphs, 0) << what;
    EXPECT_GT(graphs.graph_steps, 0) << what;
    EXPECT_TRUE(torch::equal(graphs.responses, eager.responses)) << what;
    EXPECT_TRUE(torch::equal(graphs.response_mask, eager.response_mask)) << what;
    EXPECT_TRUE(torch::allclose(graphs.log_probs, eager.log_probs, 1e-3, 1e-4)) << what;
    EXPECT_LT(graphs.host_syncs, eager.host_syncs) << what;
  }
}

// Graphs by default (the trainer's enforce_eager unset on a GPU: cuda_graphs without require_cuda_graphs) where
// they cannot replay (the slots cache) decode eagerly, with the eager tokens; asked for by name
// (require_cuda_graphs, enforce_eager: false) the same call fails naming the key in the way, and on the paged
// cache it replays them.
TEST(CudaParity, DecodeGraphsByDefaultFallBackWhereTheyCannotAndByNameAreRefused) {
  SKIP_WITHOUT_GPU();
  ModelPair p = make_pair(torch::kFloat32, 8.0);
  const auto prompts = paged_prompts();
  GenerationConfig cfg = paged_greedy_config();
  cfg.paged_kv_cache = false;
  const GenerationOutput eager = generate(p.gpu, prompts, cfg);
  cfg.cuda_graphs = true;
  const GenerationOutput fallback = generate(p.gpu, prompts, cfg);
  EXPECT_EQ(fallback.graph_steps, 0);
  EXPECT_TRUE(torch::equal(fallback.responses, eager.responses));
  cfg.require_cuda_graphs = true;
  try {
    generate(p.gpu, prompts, cfg);
    ADD_FAILURE() << "graphs asked for by name on the slots cache were not refused";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("enforce_eager"), std::string::npos) << what;
    EXPECT_NE(what.find("kv_cache: slots"), std::string::npos) << what;
  }
  cfg.paged_kv_cache = true;
  const GenerationOutput required = generate(p.gpu, prompts, cfg);
  EXPECT_GT(required.graph_steps, 0);
}

// The fused decode kernels on the GPU against the unfused operators on the GPU and against their own CPU
// references (the same arithmetic in loops): fp32 to 1e-5, bf16 to 1e-2 (one bf16 rounding, 2^-8 relative, where
// a reduction or exp lands on the other side of a tie).
TEST(CudaParity, DecodeKernelsElementwiseMatchTheUnfusedOperatorsAndTheCpu) {
  SKIP_WITHOUT_GPU();
  torch::manual_seed(8);
  const torch::Device gpu(torch::kCUDA);
  for (torch::Dtype dtype : {torch::kFloat32, torch::kBFloat16}) {
    const double tol = dtype == torch::kFloat32 ? 1e-5 : 1e-2;
    const std::string what = dtype == torch::kFloat32 ? "fp32" : "bf16";
    auto close = [&](const torch::Tensor& a, const torch::Tensor& b, const std::string& op) {
      EXPECT_TRUE(torch::allclose(a.cpu().to(torch::kFloat32), b.cpu().to(torch::kFloat32), tol, tol))
          << what << " " << op << " max diff "
          << (a.cpu().to(torch::kFloat32) - b.cpu().to(torch::kFloat32)).abs().max().item<double>();
    };
    const auto x = torch::randn({9, 1, 1536}).to(dtype), delta = torch::randn({9, 1, 1536}).to(dtype);
    const auto weight = (1 + 0.1 * torch::randn({1536})).to(dtype);
    const auto xg = x.to(gpu), dg = delta.to(gpu), wg = weight.to(gpu);
    close(kernels::rms_norm(xg, wg, 1e-6), testing::unfused_rms_norm(xg, wg, 1e-6), "rms_norm vs operators");
    close(kernels::rms_norm(xg, wg, 1e-6), kernels::rms_norm(x, weight, 1e-6), "rms_norm vs CPU reference");
    auto both = kernels::add_rms_norm(xg, dg, wg, 1e-6);
    EXPECT_TRUE(torch::equal(both.sum, xg + dg)) << what << " residual add";
    close(both.normed, testing::unfused_rms_norm(xg + dg, wg, 1e-6), "add_rms_norm vs operators");
    close(both.normed, kernels::add_rms_norm(x, delta, weight, 1e-6).normed, "add_rms_norm vs CPU reference");
    const auto gate = (3 * torch::randn({9, 1, 4096})).to(dtype), up = torch::randn({9, 1, 4096}).to(dtype);
    close(kernels::swiglu(gate.to(gpu), up.to(gpu)), torch::silu(gate.to(gpu)) * up.to(gpu), "swiglu vs operators");
    close(kernels::swiglu(gate.to(gpu), up.to(gpu)), kernels::swiglu(gate, up), "swiglu vs CPU reference");
    const auto q = torch::randn({9, 16, 128}).to(dtype);
    const auto angles = torch::rand({9, 128}) * 100;
    const auto cos = angles.cos().to(dtype), sin = angles.sin().to(dtype);
    auto rotated = kernels::rotary(q.to(gpu), cos.to(gpu), sin.to(gpu));
    close(rotated, q.to(gpu) * cos.to(gpu).unsqueeze(1) + testing::rotate_half(q.to(gpu)) * sin.to(gpu).unsqueeze(1),
          "rotary vs operators");
    close(rotated, kernels::rotary(q, cos, sin), "rotary vs CPU reference");
  }
}

// The fused q/k norm + rotary + cache write kernel (kernels/decode_fusions.h) on the GPU: bit for bit the GPU
// kernels and index_copy_ it replaces (its norm reduces a head in rms_norm_kernel's order), within a dtype
// rounding of the unfused operators on the GPU, and equal to its CPU reference up to the norm's reduction order;
// Qwen3-1.7B's heads (16 / 8 of 128 dims) and a head_dim short of a warp multiple, with and without the norms.
TEST(CudaParity, DecodeFusionsQkNormRotaryCacheWriteMatchesTheSeparateKernelsAndTheCpu) {
  SKIP_WITHOUT_GPU();
  torch::manual_seed(12);
  const torch::Device gpu(torch::kCUDA);
  const double eps = 1e-6;
  for (torch::Dtype dtype : {torch::kFloat32, torch::kBFloat16}) {
    const double tol = dtype == torch::kFloat32 ? 1e-5 : 4e-2;
    for (bool norms : {true, false}) {
      for (auto [heads, kv, dim] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{{16, 8, 128}, {4, 2, 80}}) {
        const std::string what = std::string(dtype == torch::kFloat32 ? "fp32" : "bf16") +
                                 (norms ? " with norms" : " without norms") + " dim " + std::to_string(dim);
        const auto cpu = testing::qk_cache_case({0, 5, 16, 300, 1023, 77, 64}, heads, kv, dim, 16, norms, dtype);
        auto fused = cpu.to(gpu), separate = cpu.to(gpu), unfused = cpu.to(gpu), reference = cpu.clone();
        const auto q = testing::fused_qk_norm_rotary_cache_write(fused, eps);
        EXPECT_TRUE(torch::equal(q, testing::separate_qk_kernels_and_cache_writes(separate, eps))) << what;
        EXPECT_TRUE(torch::equal(fused.key_pool, separate.key_pool)) << what;
        EXPECT_TRUE(torch::equal(fused.value_pool, separate.value_pool)) << what;
        auto close = [&](const torch::Tensor& a, const torch::Tensor& b, const std::string& against) {
          const auto x = a.cpu().to(torch::kFloat32), y = b.cpu().to(torch::kFloat32);
          EXPECT_TRUE(torch::allclose(x, y, tol, tol))
              << what << " vs " << against << " max diff " << (x - y).abs().max().item<double>();
        };
        close(q, testing::unfused_qk_operators_and_cache_writes(unfused, eps), "operators");
        close(fused.key_pool, unfused.key_pool, "operators' keys");
        close(q, testing::fused_qk_norm_rotary_cache_write(reference, eps), "CPU reference");
        close(fused.key_pool, reference.key_pool, "CPU reference's keys");
        EXPECT_TRUE(torch::equal(fused.value_pool.cpu(), reference.value_pool)) << what;
      }
    }
  }
}

// The rotary tables kernel on the GPU against rotary_cos_sin's operators on the GPU (CUDA's cosf and sinf on both
// sides: a last fp32 bit at most where the math library's contraction differs) and against its CPU reference.
TEST(CudaParity, DecodeFusionsRotaryTablesMatchTheOperatorsAndTheCpu) {
  SKIP_WITHOUT_GPU();
  const torch::Device gpu(torch::kCUDA);
  const auto positions = torch::tensor({0, 1, 7, 991, 1023, 4097, 40959}, torch::kInt64);
  const auto inv_freq = testing::qwen3_inv_freq(128);
  for (double scaling : {1.0, 1.2}) {
    for (torch::Dtype dtype : {torch::kFloat32, torch::kBFloat16}) {
      const std::string what = std::string(dtype == torch::kFloat32 ? "fp32" : "bf16") + " scaling " +
                               std::to_string(scaling);
      const double tol = dtype == torch::kFloat32 ? 1e-6 : 8e-3;
      const auto fused = kernels::rotary_tables(positions.to(gpu), inv_freq.to(gpu), scaling, dtype);
      const auto [cos, sin] = testing::unfused_rotary_tables(positions.to(gpu), inv_freq.to(gpu), scaling, dtype);
      const auto reference = kernels::rotary_tables(positions, inv_freq, scaling, dtype);
      for (const auto& [a, b, against] :
           std::vector<std::tuple<torch::Tensor, torch::Tensor, std::string>>{{fused.cos, cos, "operators' cos"},
                                                                              {fused.sin, sin, "operators' sin"},
                                                                              {fused.cos, reference.cos, "CPU cos"},
                                                                              {fused.sin, reference.sin, "CPU sin"}}) {
        const auto x = a.cpu().to(torch::kFloat32), y = b.cpu().to(torch::kFloat32);
        EXPECT_TRUE(torch::allclose(x, y, tol, tol)) << what << " vs " << against << " max diff "
                                                     << (x - y).abs().max().item<double>();
      }
    }
  }
}

// The paged decode attention's two CUDA variants (HF_PAGED_ATTENTION=v1, the default, and v2) at long contexts
// (many partitions reduced by the second kernel, and one partition that v2 writes directly), with and without a
// sliding window, in fp32, bf16 and fp16: each against gathered K/V through SDPA on the GPU, against the CPU
// reference, and v2 against v1. Shapes: head_dim 128 at GQA 2 (Qwen3) and 7 (a tile of 8 heads, one idle);
// 64 (teams of 8 lanes); 96 (12 lanes of a team of 16); 36 (no 16-byte loads in 16-bit dtypes); 32 query heads
// over one KV head (four tiles). Then rows x KV heads enough for v2 not to split (its chosen size, no reduce).
TEST(CudaParity, DecodeKernelsPagedAttentionMatchesGatheredSdpaAndTheCpu) {
  SKIP_WITHOUT_GPU();
  torch::manual_seed(9);
  const auto saved = kernels::paged_attention_variant();
  const torch::Device gpu(torch::kCUDA);
  using Variant = kernels::PagedAttentionVariant;
  const auto name = [](torch::Dtype t) {
    return std::string(t == torch::kFloat32 ? "fp32" : t == torch::kBFloat16 ? "bf16" : "fp16");
  };
  // fp32: summation order only; bf16 and fp16: one rounding of the output.
  const auto tolerance = [](torch::Dtype t) {
    return t == torch::kFloat32 ? 1e-5 : t == torch::kBFloat16 ? 1e-2 : 1e-3;
  };
  const auto attend = [&](Variant variant, const testing::PagedCase& c, double scale, int64_t window,
                          int64_t partition) {
    kernels::set_paged_attention_variant(variant);
    return kernels::paged_decode_attention(c.q, c.key_pool, c.value_pool, c.tables, c.lengths, c.span, scale,
                                           window, partition)
        .cpu();
  };
  const auto expect_close = [](const torch::Tensor& a, const torch::Tensor& b, double tol, const std::string& what) {
    EXPECT_TRUE(torch::allclose(a.to(torch::kFloat32), b.to(torch::kFloat32), tol, tol))
        << what << ", max diff " << (a.to(torch::kFloat32) - b.to(torch::kFloat32)).abs().max().item<double>();
  };
  struct Shape {
    int64_t heads, kv, dim;
  };
  for (torch::Dtype dtype : {torch::kFloat32, torch::kBFloat16, torch::kFloat16}) {
    const double tol = tolerance(dtype);
    for (const Shape& shape : std::vector<Shape>{{16, 8, 128}, {14, 2, 128}, {8, 4, 64}, {6, 2, 96}, {4, 2, 36},
                                                 {32, 1, 64}}) {
      const double scale = 1.0 / std::sqrt(static_cast<double>(shape.dim));
      for (int64_t window : {int64_t{0}, int64_t{300}}) {
        const auto cpu = testing::paged_case({0, 17, 1023, 2900, 64, 511}, shape.heads, shape.kv, shape.dim, 16, dtype);
        const auto c = cpu.to(gpu);
        const std::string what = name(dtype) + " heads " + std::to_string(shape.heads) + "/" +
                                 std::to_string(shape.kv) + " dim " + std::to_string(shape.dim) + " window " +
                                 std::to_string(window);
        const auto reference = testing::unfused_paged_attention(c, scale, window).cpu();
        const auto on_cpu = kernels::paged_decode_attention(cpu.q, cpu.key_pool, cpu.value_pool, cpu.tables,
                                                            cpu.lengths, cpu.span, scale, window);
        for (int64_t partition : {int64_t{0}, int64_t{32}, int64_t{256}, c.span}) {
          const std::string at = what + " partition " + std::to_string(partition);
          const auto v1 = attend(Variant::kV1, c, scale, window, partition);
          const auto v2 = attend(Variant::kV2, c, scale, window, partition);
          ASSERT_EQ(v2.scalar_type(), dtype) << at;
          ASSERT_EQ(v2.sizes(), c.q.sizes()) << at;
          expect_close(v1, reference, tol, at + " v1 vs SDPA");
          expect_close(v2, reference, tol, at + " v2 vs SDPA");
          expect_close(v1, on_cpu, tol, at + " v1 vs the CPU reference");
          expect_close(v2, on_cpu, tol, at + " v2 vs the CPU reference");
          expect_close(v2, v1, tol, at + " v2 vs v1");
        }
      }
    }
  }
  // 40 rows x 8 KV heads reach twice an H100's or H200's 132 multiprocessors: v2 takes the span in one partition.
  std::vector<int64_t> lengths;
  for (int64_t r = 0; r < 40; ++r) lengths.push_back((r * 131) % 1100);
  for (torch::Dtype dtype : {torch::kFloat32, torch::kBFloat16}) {
    const auto c = testing::paged_case(lengths, 16, 8, 128, 16, dtype).to(gpu);
    const double scale = 1.0 / std::sqrt(128.0);
    const auto reference = testing::unfused_paged_attention(c, scale, 0).cpu();
    const auto v1 = attend(Variant::kV1, c, scale, 0, 0), v2 = attend(Variant::kV2, c, scale, 0, 0);
    expect_close(v2, reference, tolerance(dtype), name(dtype) + " 40 rows: v2 vs SDPA");
    expect_close(v2, v1, tolerance(dtype), name(dtype) + " 40 rows: v2 vs v1");
  }
  kernels::set_paged_attention_variant(saved);
}

// Generation through the fused decode kernels (the default on CUDA), with either paged attention variant, chooses
// the tokens of the gather path (HF_DECODE_KERNELS=off: gathered K/V, SDPA and the unfused operators) and of the
// CPU, eager and replayed as CUDA graphs, in fp32 and bf16; log-probs agree to rounding.
TEST(CudaParity, DecodeKernelsGenerationChoosesTheGatherPathsTokens) {
  SKIP_WITHOUT_GPU();
  const auto saved = kernels::mode();
  const auto saved_variant = kernels::paged_attention_variant();
  for (auto variant : {kernels::PagedAttentionVariant::kV1, kernels::PagedAttentionVariant::kV2}) {
    kernels::set_paged_attention_variant(variant);
    const std::string label = variant == kernels::PagedAttentionVariant::kV1 ? "v1 " : "v2 ";
    for (torch::Dtype dtype : {torch::kFloat32, torch::kBFloat16}) {
      // Weights scaled by 8 spread fp32's logits; in bf16 the scaled activations' rounding alone flips greedy
      // choices (the gather path leaves fp32's tokens; tests/engine/test_generation.cpp), so bf16 runs unscaled.
      ModelPair p = make_pair(dtype, dtype == torch::kFloat32 ? 8.0 : 1.0);
      const auto prompts = paged_prompts();
      GenerationConfig cfg = paged_greedy_config();
      const std::string what = label + (dtype == torch::kFloat32 ? "fp32" : "bf16");
      const double tol = dtype == torch::kFloat32 ? 1e-4 : 5e-2;
      for (bool graphs : {false, true}) {
        cfg.cuda_graphs = graphs;
        kernels::set_mode(kernels::Mode::kOff);
        auto gathered = generate(p.gpu, prompts, cfg);
        kernels::set_mode(kernels::Mode::kCuda);
        auto fused = generate(p.gpu, prompts, cfg);
        const std::string how = what + (graphs ? " graphs" : " eager");
        EXPECT_TRUE(torch::equal(fused.responses, gathered.responses)) << how;
        EXPECT_TRUE(torch::allclose(fused.log_probs, gathered.log_probs, 1e-3, tol))
            << how << " max diff " << (fused.log_probs - gathered.log_probs).abs().max().item<float>();
        if (dtype == torch::kFloat32) {
          auto cpu = generate(p.cpu, prompts, cfg);
          EXPECT_TRUE(torch::equal(fused.responses.cpu(), cpu.responses)) << how << " vs the CPU";
        }
      }
    }
  }
  kernels::set_paged_attention_variant(saved_variant);
  kernels::set_mode(saved);
}

// The few-rows projection kernel (kernels/few_rows_linear.h, HF_DECODE_GEMV=on) on the GPU: bit for bit its CPU
// reference (the same lanes, order and butterfly; --fmad=false), for one to eight rows of Qwen3-1.7B's width (k
// 2048) into q, k and v at once with a bias on one, the head's float32 form, and the 16-bit dtypes; SwiGLU of the
// gate and up projections bit for bit kernels::swiglu of the two on the GPU (CUDA's expf on both sides) and within
// a rounding of the CPU's; within the dtype's rounding of libtorch's matmul on the GPU.
TEST(CudaParity, DecodeKernelsFewRowsLinearEqualsItsCpuReferenceBitForBit) {
  SKIP_WITHOUT_GPU();
  torch::manual_seed(12);
  const torch::Device gpu(torch::kCUDA);
  const int64_t k = 2048;
  for (torch::Dtype dtype : {torch::kFloat32, torch::kBFloat16, torch::kHalf}) {
    for (int64_t rows : {1, 2, 3, 8}) {
      const std::string what = std::string(c10::toString(dtype)) + " rows " + std::to_string(rows);
      const auto x = torch::randn({rows, k}).to(dtype);
      const std::vector<torch::Tensor> weights = {(torch::randn({256, k}) / 32).to(dtype),
                                                  (torch::randn({128, k}) / 32).to(dtype),
                                                  (torch::randn({136, k}) / 32).to(dtype)};
      const std::vector<torch::Tensor> biases = {torch::Tensor(), torch::randn({128}).to(dtype), torch::Tensor()};
      std::vector<torch::Tensor> weights_gpu, biases_gpu;
      for (const auto& w : weights) weights_gpu.push_back(w.to(gpu));
      for (const auto& b : biases) biases_gpu.push_back(b.defined() ? b.to(gpu) : b);
      const auto on_gpu = kernels::few_rows_linear(x.to(gpu), weights_gpu, biases_gpu);
      const auto on_cpu = kernels::few_rows_linear(x, weights, biases);
      const double tol = dtype == torch::kFloat32 ? 1e-4 : dtype == torch::kBFloat16 ? 3e-2 : 4e-3;
      for (size_t i = 0; i < weights.size(); ++i) {
        EXPECT_TRUE(torch::equal(on_gpu[i].cpu(), on_cpu[i])) << what << " part " << i << " max diff "
            << (on_gpu[i].cpu().to(torch::kFloat32) - on_cpu[i].to(torch::kFloat32)).abs().max().item<float>();
        const auto matmul = torch::linear(x.to(gpu), weights_gpu[i], biases_gpu[i]);
        EXPECT_TRUE(torch::allclose(on_gpu[i].to(torch::kFloat32), matmul.to(torch::kFloat32), tol, tol)) << what;
      }
      const auto head = kernels::few_rows_linear(x.to(gpu), {weights_gpu[0]}, {}, /*float_out=*/true)[0];
      EXPECT_EQ(head.scalar_type(), torch::kFloat32);
      EXPECT_TRUE(torch::equal(head.cpu(), on_cpu[0].to(torch::kFloat32))) << what << " float32 out";
      const auto fused = kernels::few_rows_swiglu(x.to(gpu), weights_gpu[0], weights_gpu[0].flip(0).contiguous());
      const auto pair = kernels::few_rows_linear(x.to(gpu), {weights_gpu[0], weights_gpu[0].flip(0).contiguous()});
      EXPECT_TRUE(torch::equal(fused, kernels::swiglu(pair[0], pair[1]))) << what << " swiglu";
      const auto fused_cpu = kernels::few_rows_swiglu(x, weights[0], weights[0].flip(0).contiguous());
      EXPECT_TRUE(torch::allclose(fused.cpu().to(torch::kFloat32), fused_cpu.to(torch::kFloat32), tol, tol))
          << what << " swiglu vs the CPU";
    }
  }
}

// Generation with the decode step's projections on the few-rows kernel (HF_DECODE_GEMV=on; at most six rows
// here, so every step takes it: q/k/v with Qwen2's biases, o, gate/up + SwiGLU, down and the head) chooses the
// tokens of the fused decode path's matmuls, eager and replayed as CUDA graphs, fp32 and bf16; log-probs agree
// to rounding.
TEST(CudaParity, DecodeKernelsFewRowsGenerationChoosesTheMatmulsTokens) {
  SKIP_WITHOUT_GPU();
  const bool saved = kernels::few_rows_linear_enabled();
  for (torch::Dtype dtype : {torch::kFloat32, torch::kBFloat16}) {
    ModelPair p = make_pair(dtype, dtype == torch::kFloat32 ? 8.0 : 1.0);
    const auto prompts = paged_prompts();
    GenerationConfig cfg = paged_greedy_config();
    const double tol = dtype == torch::kFloat32 ? 1e-4 : 5e-2;
    for (bool graphs : {false, true}) {
      cfg.cuda_graphs = graphs;
      const std::string how = std::string(dtype == torch::kFloat32 ? "fp32" : "bf16") + (graphs ? " graphs" : " eager");
      kernels::set_few_rows_linear_enabled(false);
      auto matmuls = generate(p.gpu, prompts, cfg);
      kernels::set_few_rows_linear_enabled(true);
      auto few_rows = generate(p.gpu, prompts, cfg);
      EXPECT_TRUE(torch::equal(few_rows.responses, matmuls.responses)) << how;
      EXPECT_TRUE(torch::allclose(few_rows.log_probs, matmuls.log_probs, 1e-3, tol))
          << how << " max diff " << (few_rows.log_probs - matmuls.log_probs).abs().max().item<float>();
    }
  }
  kernels::set_few_rows_linear_enabled(saved);
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

// The model's RMSNorm on the GPU is libtorch's fused kernel (model/rms_norm.h): forward values and both gradients
// agree with transformers' operators (float32 closely; bf16 to its rounding, which the fused kernel does once where
// the operators round twice); a pass without gradients takes the same kernel, and generation's scope the operators.
TEST(CudaParity, RmsNormIsFusedOutsideGenerationAndMatchesTheOperators) {
  SKIP_WITHOUT_GPU();
  torch::manual_seed(4);
  for (torch::Dtype dtype : {torch::kFloat32, torch::kBFloat16}) {
    const auto x0 = (torch::randn({6, 7, 256}) * 3).to(dtype).cuda();
    const auto w0 = (torch::rand({256}) + 0.5).to(dtype).cuda();
    const auto g = torch::randn({6, 7, 256}).to(dtype).cuda();
    auto run = [&](bool fused) {
      auto x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_();
      torch::Tensor y;
      if (fused) {
        EXPECT_TRUE(rms_norm_fused_for(x, w));
        y = rms_norm(x, w, 1e-6);
        EXPECT_NE(y.grad_fn()->name().find("FusedRmsNorm"), std::string::npos) << y.grad_fn()->name();
      } else {
        auto h = x.to(torch::kFloat32);
        h = h * torch::rsqrt(h.pow(2).mean(-1, true) + 1e-6);
        y = w * h.to(dtype);
      }
      y.backward(g);
      return std::make_tuple(y.detach().to(torch::kFloat32), x.grad().to(torch::kFloat32), w.grad().to(torch::kFloat32));
    };
    const auto [y, dx, dw] = run(true);
    const auto [y_ops, dx_ops, dw_ops] = run(false);
    const double tol = dtype == torch::kFloat32 ? 1e-5 : 2e-2;
    const std::string what = dtype == torch::kFloat32 ? "fp32" : "bf16";
    EXPECT_TRUE(torch::allclose(y, y_ops, tol, tol)) << what << " " << (y - y_ops).abs().max().item<float>();
    EXPECT_TRUE(torch::allclose(dx, dx_ops, tol, tol)) << what << " " << (dx - dx_ops).abs().max().item<float>();
    // The weight's gradient sums 42 rows: its rounding grows with them.
    EXPECT_TRUE(torch::allclose(dw, dw_ops, 4 * tol, 4 * tol)) << what << " " << (dw - dw_ops).abs().max().item<float>();
    // Without gradients the same kernel: the forward equals the recorded pass's bit for bit.
    {
      torch::NoGradGuard no_grad;
      EXPECT_TRUE(rms_norm_fused_for(x0, w0)) << what;
      EXPECT_TRUE(torch::equal(rms_norm(x0, w0, 1e-6).to(torch::kFloat32), y)) << what << " without gradients";
    }
    // Generation's scope keeps the operators, bit for bit.
    {
      const OperatorRmsNormScope operators;
      torch::NoGradGuard no_grad;
      EXPECT_FALSE(rms_norm_fused_for(x0, w0)) << what;
      EXPECT_TRUE(torch::equal(rms_norm(x0, w0, 1e-6).to(torch::kFloat32), y_ops)) << what << " in generation's scope";
    }
  }
}

// The rotary embedding as one CUDA kernel each way (model/rotary_rows.h, on by default on a GPU) in a whole
// training pass: logits and every parameter's gradient bit for bit the operators' (HF_DECODE_KERNELS=off keeps
// them), fp32 and bf16, a left-padded row included.
TEST(CudaParity, RotaryKernelInATrainingPassIsTheOperatorsBitForBit) {
  SKIP_WITHOUT_GPU();
  const auto saved = kernels::mode();
  for (torch::Dtype dtype : {torch::kFloat32, torch::kBFloat16}) {
    ModelPair p = make_pair(dtype);
    const auto ids = batch_ids().cuda(), mask = left_padded_mask().cuda();
    auto run = [&](kernels::Mode mode) {
      kernels::set_mode(mode);
      p.gpu->zero_grad();
      const auto logits = p.gpu->forward(ids, mask).logits;
      logits.to(torch::kFloat32).pow(2).mean().backward();
      std::vector<torch::Tensor> out = {logits.detach()};
      for (const auto& w : p.gpu->parameters()) out.push_back(w.grad().clone());
      return out;
    };
    const auto fused = run(kernels::Mode::kCuda), ops = run(kernels::Mode::kOff);
    const std::string what = dtype == torch::kFloat32 ? "fp32" : "bf16";
    for (size_t i = 0; i < fused.size(); ++i)
      EXPECT_TRUE(torch::equal(fused[i], ops[i])) << what << (i == 0 ? " logits" : " gradient " + std::to_string(i - 1));
  }
  kernels::set_mode(saved);
}

// The old log-probs (no gradients) and the update's first forward (gradients recorded) on the GPU, both through
// the fused RMSNorm: bit for bit equal, so PPO's ratio starts at exactly 1 (the CPU's version is in
// test_head_log_probs); fp32 and bf16, a left-padded row included.
TEST(CudaParity, LogProbsWithAndWithoutGradientsAreBitForBitEqual) {
  SKIP_WITHOUT_GPU();
  for (torch::Dtype dtype : {torch::kFloat32, torch::kBFloat16}) {
    ModelPair p = make_pair(dtype);
    const auto ids = batch_ids().cuda(), mask = left_padded_mask().cuda();
    TokenLogProbs old;
    {
      torch::NoGradGuard no_grad;
      old = response_log_probs(p.gpu, ids, mask, 5, 0.7, true);
    }
    auto recorded = response_log_probs(p.gpu, ids, mask, 5, 0.7, true);
    ASSERT_TRUE(recorded.log_probs.requires_grad());
    const std::string what = dtype == torch::kFloat32 ? "fp32" : "bf16";
    EXPECT_TRUE(torch::equal(old.log_probs, recorded.log_probs.detach()))
        << what << " max diff " << (old.log_probs - recorded.log_probs.detach()).abs().max().item<float>();
    EXPECT_TRUE(torch::equal(old.entropy, recorded.entropy.detach())) << what;
  }
}

// A GPU's head chunk (head_chunk_tokens on CUDA: 883 tokens of a 152k vocabulary) against the CPU's 55-token
// chunks on the same GPU: the same log-probs, entropies and gradients up to the matmuls' rounding, over a ragged
// last chunk. bf16 weights, as the trainer's actor has them.
TEST(CudaParity, HeadLogProbsInTheGpusLongChunksMatchShortChunks) {
  SKIP_WITHOUT_GPU();
  const int64_t tokens = 2000, hidden = 64, vocab = 151936;
  ASSERT_EQ(head_chunk_tokens(vocab, torch::kCUDA), 883);
  torch::manual_seed(3);
  const auto bf16 = torch::TensorOptions().dtype(torch::kBFloat16).device(torch::kCUDA);
  const auto h0 = torch::randn({tokens, hidden}, bf16), w0 = (torch::randn({vocab, hidden}) * 0.3).to(bf16);
  const auto targets = torch::randint(0, vocab, {tokens}, torch::TensorOptions().dtype(torch::kLong).device(torch::kCUDA));
  const auto g_lp = torch::randn({tokens}, torch::TensorOptions().device(torch::kCUDA));
  const auto g_h = torch::randn({tokens}, torch::TensorOptions().device(torch::kCUDA));
  auto run = [&](int64_t chunk) {
    auto h = h0.clone().set_requires_grad(true), w = w0.clone().set_requires_grad(true);
    auto out = head_log_probs(h, w, targets, 0.9, true, {}, chunk);
    ((out.log_probs * g_lp).sum() + (out.entropy * g_h).sum()).backward();
    return std::vector<torch::Tensor>{out.log_probs.detach().cpu(), out.entropy.detach().cpu(),
                                      h.grad().to(torch::kFloat32).cpu(), w.grad().to(torch::kFloat32).cpu()};
  };
  const auto long_chunks = run(0), short_chunks = run(55);
  const char* names[] = {"log-probs", "entropy", "hidden's gradient", "weight's gradient"};
  for (size_t i = 0; i < long_chunks.size(); ++i) {
    const double scale = short_chunks[i].abs().max().item<double>();
    const double diff = (long_chunks[i] - short_chunks[i]).abs().max().item<double>();
    EXPECT_LE(diff, 2e-2 * scale) << names[i] << ": max diff " << diff << " of " << scale;
  }
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

// The fused CUDA paths against the loops they replace, on the GPU, in bf16: the same model's logits and every
// parameter's gradient of one loss, once with the fused path and once under a PortableKernelsGuard.
struct ForwardAndGrads {
  torch::Tensor logits;
  std::map<std::string, torch::Tensor> grads;
};

ForwardAndGrads forward_and_grads(CausalLM& model, const torch::Tensor& ids, const torch::Tensor& mask,
                                  bool portable) {
  PortableKernelsGuard guard(portable);
  model->zero_grad();
  auto logits = model->forward(ids, mask).logits.to(torch::kFloat32);
  // A loss with a dense, contiguous gradient into every logit (fixed seed: the same in both calls).
  torch::manual_seed(11);
  auto weights = torch::randn(logits.sizes(), logits.options());
  (logits * weights * mask.ne(0).unsqueeze(-1)).sum().backward();
  ForwardAndGrads out{logits.detach(), {}};
  for (auto& item : model->named_parameters())
    if (item.value().grad().defined()) out.grads[item.key()] = item.value().grad().to(torch::kFloat32).clone();
  return out;
}

// max |a - b| over max |b|.
double relative_difference(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item<double>();
}

void expect_fused_matches_portable(CausalLM& model, const torch::Tensor& ids, const torch::Tensor& mask,
                                   double tolerance) {
  const auto fused = forward_and_grads(model, ids, mask, false);
  const auto portable = forward_and_grads(model, ids, mask, true);
  const auto real = mask.ne(0).unsqueeze(-1).expand_as(fused.logits);
  EXPECT_LT(relative_difference(fused.logits.masked_select(real), portable.logits.masked_select(real)), tolerance)
      << "logits";
  ASSERT_EQ(fused.grads.size(), portable.grads.size());
  ASSERT_FALSE(fused.grads.empty());
  for (const auto& [name, grad] : portable.grads) {
    ASSERT_TRUE(fused.grads.count(name)) << name;
    if (grad.abs().max().item<double>() == 0) continue;  // e.g. an expert no token reached in either run
    EXPECT_LT(relative_difference(fused.grads.at(name), grad), tolerance) << "gradient of " << name;
  }
}

CausalLM bf16_gpu_model(const ModelConfig& config) {
  torch::manual_seed(21);
  CausalLM model(config);
  model->to(torch::Device(torch::kCUDA), torch::kBFloat16);
  return model;
}

// A Qwen3-MoE model (8 experts, top 2, hidden 128, expert width 96: 16-byte aligned): the experts as grouped
// GEMMs give the expert loop's logits and gradients (router, experts, attention) to bf16 rounding. Two layers,
// the second sparse: its router reads the same input in both runs, so no near tie can route differently.
TEST(CudaParity, GroupedExpertGemmMatchesTheExpertLoop) {
  SKIP_WITHOUT_GPU();
  ModelConfig config = preset_model_config("qwen3-moe-tiny", 97);
  config.num_hidden_layers = 2;
  const auto probe =
      torch::zeros({4, config.hidden_size}, torch::TensorOptions().dtype(torch::kBFloat16).device(torch::kCUDA));
  if (!grouped_expert_gemm_applies(probe, torch::kBFloat16, config.hidden_size, config.expert_intermediate_size()))
    GTEST_SKIP() << "the grouped expert GEMM needs compute capability 9.0 or newer";
  CausalLM model = bf16_gpu_model(config);
  torch::manual_seed(3);
  const auto ids = torch::randint(1, 97, {4, 24}, torch::kLong).cuda();
  auto mask = torch::ones({4, 24}, torch::kLong);
  mask[2].slice(0, 0, 7).zero_();  // a left-padded row
  expect_fused_matches_portable(model, ids, mask.cuda(), 3e-2);
}

// A packed row (three sequences and trailing padding, grouped-query heads): one varlen flash attention call
// gives the per-sequence loop's logits and gradients to bf16 rounding.
TEST(CudaParity, VarlenFlashAttentionOnPackedRowsMatchesThePerSequenceLoop) {
  SKIP_WITHOUT_GPU();
  ModelConfig config = preset_model_config("qwen3-tiny", 97);  // 4 heads over 2 KV heads, head_dim 48
  const auto probe = torch::zeros({1, config.num_attention_heads, 4, config.head_dim()},
                                  torch::TensorOptions().dtype(torch::kBFloat16).device(torch::kCUDA));
  if (!varlen_flash_attention_applies(probe)) GTEST_SKIP() << "varlen flash attention needs compute capability 8.0";
  CausalLM model = bf16_gpu_model(config);
  torch::manual_seed(4);
  const auto ids = torch::randint(1, 97, {1, 40}, torch::kLong).cuda();
  auto mask = torch::zeros({1, 40}, torch::kLong);
  mask[0].slice(0, 0, 13).fill_(1);
  mask[0].slice(0, 13, 30).fill_(2);
  mask[0].slice(0, 30, 35).fill_(3);  // positions 35..39: padding
  expect_fused_matches_portable(model, ids, mask.cuda(), 3e-2);
}

}  // namespace
}  // namespace hybridflow
