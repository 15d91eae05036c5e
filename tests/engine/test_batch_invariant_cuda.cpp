// Batch-invariant mode on CUDA (kernels/batch_invariant_kernels.h): the log-probs a rollout records while
// decoding with a KV cache on the GPU equal, bit for bit, what full forwards on the GPU recompute in every
// layout (alone, 3 rows, 64 rows, left or right padded; paged and slot caches, the static batch, no cache);
// each kernel gives a row the same bits whatever the batch around it, and stays close to the CPU half
// (model/batch_invariant.h). The last test measures the mode's cost in generated tokens per second. Every
// test skips where no CUDA device is visible (CI, a CPU build); scripts/gpu_check.sh runs them on a GPU.
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <vector>

#include "hybridflow/core/error.h"
#include "hybridflow/kernels/batch_invariant_kernels.h"
#include "hybridflow/model/batch_invariant.h"
#include "support/batch_invariant_layouts.h"

namespace hybridflow {
namespace {

using namespace testing::batch_invariant_layouts;

#define SKIP_WITHOUT_GPU() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device visible (CPU build or no GPU)"

const torch::Device kGpu(torch::kCUDA);

double max_difference(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.cpu() - b.cpu()).abs().max().item<double>();
}

class BatchInvariantCudaRollout : public ::testing::TestWithParam<RolloutCase> {};

TEST_P(BatchInvariantCudaRollout, RecordedLogProbsEqualEveryRecomputationBitForBit) {
  SKIP_WITHOUT_GPU();
  expect_recorded_equal_every_recomputation(GetParam(), kGpu);
}

INSTANTIATE_TEST_SUITE_P(Paths, BatchInvariantCudaRollout, ::testing::ValuesIn(rollout_cases()), rollout_case_name);

// x [130, 70] (two row tiles, in not a multiple of the k step) times w [97, 70] + bias.
TEST(BatchInvariantCuda, LinearRowsAreTheSameInAnyBatchAndCloseToTheCpu) {
  SKIP_WITHOUT_GPU();
  torch::manual_seed(1);
  const auto x = torch::randn({130, 70}), w = torch::randn({97, 70}), bias = torch::randn({97});
  const auto cpu = batch_invariant::linear(x, w, bias);
  const auto wg = w.to(kGpu), bg = bias.to(kGpu);
  const auto all = batch_invariant::linear(x.to(kGpu), wg, bg).cpu();
  EXPECT_TRUE(torch::allclose(all, cpu, 1e-5, 1e-4)) << "max |diff| " << max_difference(all, cpu);
  for (int64_t r : {0, 17, 63, 64, 100, 129}) {
    const auto alone = batch_invariant::linear(x.narrow(0, r, 1).to(kGpu), wg, bg).cpu();
    EXPECT_TRUE(torch::equal(alone[0], all[r])) << "row " << r << " alone";
    // In 3 rows at another place, and without the bias's rows changing anything else.
    const auto three = torch::cat({x.narrow(0, (r + 5) % 130, 1), x.narrow(0, r, 1), x.narrow(0, (r + 9) % 130, 1)});
    EXPECT_TRUE(torch::equal(batch_invariant::linear(three.to(kGpu), wg, bg).cpu()[1], all[r])) << "row " << r;
  }
  const auto flipped = batch_invariant::linear(x.flip(0).to(kGpu), wg, bg).cpu();
  EXPECT_TRUE(torch::equal(flipped.flip(0), all));
}

TEST(BatchInvariantCuda, LogProbsAndEntropyRowsAreTheSameInAnyBatchAndCloseToTheCpu) {
  SKIP_WITHOUT_GPU();
  torch::manual_seed(2);
  const auto logits = torch::randn({64, 1000}) * 4, targets = torch::randint(0, 1000, {64});
  const auto cpu = batch_invariant::token_log_probs(logits, targets, 0.7, true);
  const auto gpu = batch_invariant::token_log_probs(logits.to(kGpu), targets.to(kGpu), 0.7, true);
  ASSERT_TRUE(gpu.log_probs.is_cuda());
  EXPECT_TRUE(torch::allclose(gpu.log_probs.cpu(), cpu.log_probs, 1e-5, 1e-5));
  EXPECT_TRUE(torch::allclose(gpu.entropy.cpu(), cpu.entropy, 1e-5, 1e-5));
  for (int64_t r : {0, 31, 63}) {
    const auto alone = batch_invariant::token_log_probs(logits.narrow(0, r, 1).to(kGpu),
                                                        targets.narrow(0, r, 1).to(kGpu), 0.7, true);
    EXPECT_EQ(alone.log_probs.cpu()[0].item<float>(), gpu.log_probs.cpu()[r].item<float>()) << "row " << r;
    EXPECT_EQ(alone.entropy.cpu()[0].item<float>(), gpu.entropy.cpu()[r].item<float>()) << "row " << r;
  }
  EXPECT_THROW(batch_invariant::token_log_probs(logits.narrow(0, 0, 1).to(kGpu), torch::full({1}, 1000).to(kGpu),
                                                1.0, false),
               Error);
}

TEST(BatchInvariantCuda, RmsNormRowsAreTheSameInAnyBatchAndCloseToTheCpu) {
  SKIP_WITHOUT_GPU();
  torch::manual_seed(3);
  const auto x = torch::randn({40, 300}), weight = torch::randn({300});
  const auto reference = x * torch::rsqrt(x.pow(2).mean(-1, true) + 1e-6) * weight;
  const auto all = kernels::batch_invariant::rms_norm(x.to(kGpu), weight.to(kGpu), 1e-6).cpu();
  EXPECT_TRUE(torch::allclose(all, reference, 1e-5, 1e-5)) << "max |diff| " << max_difference(all, reference);
  const auto alone = kernels::batch_invariant::rms_norm(x.narrow(0, 23, 1).to(kGpu), weight.to(kGpu), 1e-6).cpu();
  EXPECT_TRUE(torch::equal(alone[0], all[23]));
}

// Two sequences in a paged pool (blocks of 4, tables naming blocks out of order), grouped query heads, a
// sliding window and a key mask: each token's attention against softmax(q k / sqrt(d)) v in double.
TEST(BatchInvariantCuda, AttentionMatchesASoftmaxOverTheVisibleKeys) {
  SKIP_WITHOUT_GPU();
  torch::manual_seed(4);
  const int64_t heads = 4, kv = 2, dim = 48, block = 4, window = 5;
  const auto key_pool = torch::randn({6, kv, block, dim}), value_pool = torch::randn({6, kv, block, dim});
  const auto tables = torch::tensor({4, 0, 2, 5, 1, 3}, torch::kInt64).view({2, 3});
  const std::vector<int64_t> rows = {0, 0, 1, 1, 1}, slots = {3, 9, 0, 6, 11};
  auto mask = torch::ones({2, 12}, torch::kInt64);
  mask[1][2] = 0;  // a padding key of row 1
  const auto q = torch::randn({5, heads * dim});
  const double scale = 1.0 / std::sqrt(static_cast<double>(dim));
  kernels::batch_invariant::Places places{torch::tensor(rows).to(kGpu), torch::tensor(slots).to(kGpu),
                                          tables.to(kGpu), block};
  const auto got = kernels::batch_invariant::attention(q.to(kGpu), key_pool.to(kGpu), value_pool.to(kGpu), places,
                                                       mask.to(kGpu), heads, window, scale)
                       .cpu();
  auto expected = torch::zeros({5, heads * dim}, torch::kFloat64);
  for (int64_t t = 0; t < 5; ++t)
    for (int64_t h = 0; h < heads; ++h) {
      std::vector<torch::Tensor> keys, values;
      for (int64_t j = std::max<int64_t>(0, slots[t] - window + 1); j <= slots[t]; ++j) {
        if (mask[rows[t]][j].item<int64_t>() == 0) continue;
        const int64_t b = tables[rows[t]][j / block].item<int64_t>();
        keys.push_back(key_pool[b][h / (heads / kv)][j % block]);
        values.push_back(value_pool[b][h / (heads / kv)][j % block]);
      }
      const auto query = q[t].narrow(0, h * dim, dim).to(torch::kFloat64);
      const auto p = torch::softmax(torch::stack(keys).to(torch::kFloat64).matmul(query) * scale, 0);
      expected[t].narrow(0, h * dim, dim).copy_(p.matmul(torch::stack(values).to(torch::kFloat64)));
    }
  EXPECT_TRUE(torch::allclose(got.to(torch::kFloat64), expected, 1e-5, 1e-5))
      << "max |diff| " << max_difference(got.to(torch::kFloat64), expected);
}

// Qwen3's per-head norms, then rotary, on 3 tokens of 2 sequences; the keys and values land in the paged pool
// at each token's slot.
TEST(BatchInvariantCuda, HeadsIntoCacheNormRotateAndWriteEachTokensSlot) {
  SKIP_WITHOUT_GPU();
  torch::manual_seed(8);
  const int64_t heads = 4, kv = 2, dim = 40, block = 4, tokens = 3;
  const auto q = torch::randn({tokens, heads * dim}), k = torch::randn({tokens, kv * dim});
  const auto v = torch::randn({tokens, kv * dim}), q_norm = torch::randn({dim}), k_norm = torch::randn({dim});
  const auto angles = torch::rand({tokens, dim / 2}) * 6;
  const auto cos = torch::cat({angles.cos(), angles.cos()}, 1), sin = torch::cat({angles.sin(), angles.sin()}, 1);
  const auto tables = torch::tensor({3, 1, 0, 2}, torch::kInt64).view({2, 2});
  const std::vector<int64_t> rows = {0, 1, 1}, slots = {5, 2, 7};
  kernels::batch_invariant::HeadsIntoCache args{q.to(kGpu), k.to(kGpu), v.to(kGpu), q_norm.to(kGpu), k_norm.to(kGpu),
                                                cos.to(kGpu), sin.to(kGpu), torch::zeros({4, kv, block, dim}, kGpu),
                                                torch::zeros({4, kv, block, dim}, kGpu), heads, kv, 1e-6};
  kernels::batch_invariant::heads_into_cache(
      args, {torch::tensor(rows).to(kGpu), torch::tensor(slots).to(kGpu), tables.to(kGpu), block});
  // x [tokens, n, dim]: weight * x / rms(x) per head, then x cos + rotate_half(x) sin with the token's tables.
  auto expected = [&](const torch::Tensor& x, const torch::Tensor& weight, int64_t n) {
    const auto h = x.view({tokens, n, dim});
    const auto normed = h * torch::rsqrt(h.pow(2).mean(-1, true) + 1e-6) * weight;
    const auto rotated = torch::cat({-normed.narrow(2, dim / 2, dim / 2), normed.narrow(2, 0, dim / 2)}, 2);
    return normed * cos.unsqueeze(1) + rotated * sin.unsqueeze(1);
  };
  const auto want_q = expected(q, q_norm, heads), want_k = expected(k, k_norm, kv);
  EXPECT_TRUE(torch::allclose(args.q.cpu().view({tokens, heads, dim}), want_q, 1e-5, 1e-5));
  EXPECT_TRUE(torch::allclose(args.k.cpu().view({tokens, kv, dim}), want_k, 1e-5, 1e-5));
  const auto key_pool = args.key_pool.cpu(), value_pool = args.value_pool.cpu();
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t b = tables[rows[t]][slots[t] / block].item<int64_t>(), offset = slots[t] % block;
    for (int64_t g = 0; g < kv; ++g) {
      EXPECT_TRUE(torch::equal(key_pool[b][g][offset], args.k.cpu().view({tokens, kv, dim})[t][g])) << t;
      EXPECT_TRUE(torch::equal(value_pool[b][g][offset], v.view({tokens, kv, dim})[t][g])) << t;
    }
  }
}

// The whole decoder and head in the mode: the GPU's logits stay close to the CPU half's on a padded batch.
TEST(BatchInvariantCuda, ForwardLogitsCloseToTheCpuHalf) {
  SKIP_WITHOUT_GPU();
  for (const char* preset : {"qwen2-tiny", "qwen3-tiny", "mistral-tiny"}) {
    CausalLM cpu = make_model(preset), gpu = make_model(preset, kGpu);
    torch::manual_seed(6);
    const auto ids = torch::randint(1, 61, {3, 9});
    auto mask = torch::ones({3, 9}, torch::kInt64);
    mask[1].narrow(0, 0, 3).zero_();
    mask[2].narrow(0, 6, 3).zero_();
    BatchInvariantGuard on;
    torch::NoGradGuard no_grad;
    const auto expected = cpu->forward(ids, mask).logits;
    const auto got = gpu->forward(ids.to(kGpu), mask.to(kGpu)).logits.cpu();
    const auto real = mask.to(torch::kBool).unsqueeze(-1).expand_as(expected);
    EXPECT_TRUE(torch::allclose(got.masked_select(real), expected.masked_select(real), 1e-4, 1e-4))
        << preset << ": max |diff| " << (got - expected).abs().masked_select(real).max().item<double>();
  }
}

// The mode's cost: rollout tokens per second with and without it on one GPU, a 4-layer decoder of hidden
// 512 (fp32), 64 prompts x 64 new tokens, paged continuous batching. Prints a JSON line for gpu_bench.sh.
TEST(BatchInvariantCudaCost, RolloutTokensPerSecondOnAndOff) {
  SKIP_WITHOUT_GPU();
  torch::manual_seed(7);
  ModelConfig config = testing::tiny_model_config(
      {.vocab_size = 4096, .hidden_size = 512, .intermediate_size = 1536, .num_hidden_layers = 4,
       .num_attention_heads = 8, .num_key_value_heads = 4},
      "qwen2-tiny");
  CausalLM model(config);
  model->to(kGpu);
  model->eval();
  std::vector<std::vector<int64_t>> prompts;
  for (int64_t i = 0; i < 64; ++i) prompts.push_back(std::vector<int64_t>(32 + i % 16, 5 + i));
  GenerationConfig g = sampling(true, true, 0, 1);
  g.max_new_tokens = 64;
  g.eos_token_ids = {};
  g.kv_block_size = 16;
  auto tokens_per_second = [&](bool invariant) {
    BatchInvariantGuard mode(invariant);
    generate(model, {prompts[0]}, g);  // warm-up: allocator, kernels' first launches
    torch::cuda::synchronize();
    const auto start = std::chrono::steady_clock::now();
    const auto out = generate(model, prompts, g);
    torch::cuda::synchronize();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return out.response_mask.sum().item<double>() / seconds;
  };
  const double ordinary = tokens_per_second(false), invariant = tokens_per_second(true);
  ASSERT_GT(ordinary, 0.0);
  ASSERT_GT(invariant, 0.0);
  std::printf("{\"batch_invariant_tokens_per_s\": %.1f, \"ordinary_tokens_per_s\": %.1f, \"slowdown\": %.2f, "
              "\"model\": \"4 layers, hidden 512, fp32\", \"rows\": 64, \"new_tokens\": 64}\n",
              invariant, ordinary, ordinary / invariant);
}

}  // namespace
}  // namespace hybridflow
