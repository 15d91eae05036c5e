// head_log_probs against the unchunked computation (full logits through token_log_probs): values and
// gradients for several chunk sizes, temperatures, one output unused, bf16, vocabulary-parallel ranks, and the
// model-level response_log_probs; and that its peak memory does not grow with tokens x vocabulary.
#include "hybridflow/engine/head_log_probs.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "hybridflow/core/cpu_memory.h"
#include "hybridflow/core/error.h"
#include "hybridflow/engine/model_log_probs.h"
#include "parallel/rank_processes.h"
#include "support/operator_counter.h"
#include "support/tiny_model.h"

namespace hybridflow {
namespace {

struct Case {
  torch::Tensor hidden, weight, targets, w_lp, w_h;  // w_*: weights of a scalar loss over both outputs
};

Case random_case(int64_t b, int64_t t, int64_t h, int64_t v, uint64_t seed) {
  torch::manual_seed(seed);
  Case c;
  c.hidden = torch::randn({b, t, h});
  c.weight = torch::randn({v, h}) * 0.5;
  c.targets = torch::randint(0, v, {b, t}, torch::kLong);
  c.w_lp = torch::randn({b, t});
  c.w_h = torch::randn({b, t});
  return c;
}

struct Result {
  torch::Tensor log_probs, entropy, grad_hidden, grad_weight;
};

// loss = sum(w_lp * log p) + 0.3 sum(w_h * H), differentiated w.r.t. hidden and weight.
Result run(const Case& c, double temperature, bool chunked, int64_t chunk, bool use_lp = true, bool use_h = true) {
  auto hidden = c.hidden.clone().set_requires_grad(true);
  auto weight = c.weight.clone().set_requires_grad(true);
  TokenLogProbs out;
  if (chunked) {
    out = head_log_probs(hidden, weight, c.targets, temperature, /*with_entropy=*/true, {}, chunk);
  } else {
    auto logits = torch::linear(hidden, weight).to(torch::kFloat32) / temperature;
    out = token_log_probs(logits, c.targets);
  }
  auto loss = torch::zeros({});
  if (use_lp) loss = loss + (out.log_probs * c.w_lp).sum();
  if (use_h) loss = loss + 0.3 * (out.entropy * c.w_h).sum();
  loss.backward();
  return {out.log_probs.detach(), out.entropy.detach(), hidden.grad(), weight.grad()};
}

void expect_close(const torch::Tensor& a, const torch::Tensor& b, double tol, const std::string& what) {
  ASSERT_EQ(a.sizes(), b.sizes()) << what;
  EXPECT_TRUE(torch::allclose(a, b, tol, tol)) << what << ": max difference " << (a - b).abs().max().item<double>();
}

TEST(HeadLogProbs, ChunksGiveTheFullLogitsValuesAndGradients) {
  const Case c = random_case(3, 5, 8, 11, 1);
  for (double temperature : {1.0, 0.7}) {
    const Result full = run(c, temperature, false, 0);
    for (int64_t chunk : {1, 4, 15, 1000}) {  // 15 tokens: one chunk, several, a ragged last one
      const std::string what = "T=" + std::to_string(temperature) + " chunk " + std::to_string(chunk);
      const Result got = run(c, temperature, true, chunk);
      expect_close(got.log_probs, full.log_probs, 1e-5, what + " log-probs");
      expect_close(got.entropy, full.entropy, 1e-5, what + " entropy");
      expect_close(got.grad_hidden, full.grad_hidden, 1e-5, what + " d/dhidden");
      expect_close(got.grad_weight, full.grad_weight, 1e-5, what + " d/dweight");
    }
  }
}

TEST(HeadLogProbs, OneOutputAloneGetsItsOwnGradient) {
  const Case c = random_case(2, 4, 6, 9, 2);
  for (bool use_lp : {true, false}) {
    const Result full = run(c, 1.0, false, 0, use_lp, !use_lp);
    const Result got = run(c, 1.0, true, 3, use_lp, !use_lp);
    expect_close(got.grad_hidden, full.grad_hidden, 1e-5, use_lp ? "log-probs only" : "entropy only");
    expect_close(got.grad_weight, full.grad_weight, 1e-5, use_lp ? "log-probs only" : "entropy only");
  }
  // Without entropy it is not computed (and the log-probs still are).
  auto out = head_log_probs(c.hidden, c.weight, c.targets, 1.0, /*with_entropy=*/false, {}, 3);
  EXPECT_FALSE(out.entropy.defined());
  EXPECT_EQ(out.log_probs.sizes(), c.targets.sizes());
}

TEST(HeadLogProbs, Bf16MatchesTheUnchunkedBf16Path) {
  Case c = random_case(2, 6, 16, 32, 3);
  c.hidden = c.hidden.to(torch::kBFloat16);
  c.weight = c.weight.to(torch::kBFloat16);
  const Result full = run(c, 1.0, false, 0);
  const Result got = run(c, 1.0, true, 5);
  expect_close(got.log_probs, full.log_probs, 1e-4, "bf16 log-probs");  // both from the same bf16 logits
  expect_close(got.entropy, full.entropy, 1e-4, "bf16 entropy");
  EXPECT_EQ(got.grad_weight.scalar_type(), torch::kBFloat16);
  expect_close(got.grad_hidden.to(torch::kFloat), full.grad_hidden.to(torch::kFloat), 5e-2, "bf16 d/dhidden");
  expect_close(got.grad_weight.to(torch::kFloat), full.grad_weight.to(torch::kFloat), 5e-2, "bf16 d/dweight");
}

// A chunk's float32 logits fill its device's budget and no more: on a GPU 16x the CPU's tokens (fewer weight
// reads and launches per token), never fewer than one token, and a vocabulary that does not fit stays legal.
TEST(HeadLogProbs, ChunkLengthFollowsTheDevicesBudget) {
  for (int64_t vocab : {int64_t{4096}, int64_t{151936}, int64_t{151936} / 4}) {
    for (auto [device, budget] : {std::pair{torch::kCPU, kHeadChunkBytes}, std::pair{torch::kCUDA, kHeadChunkBytesCuda}}) {
      const int64_t tokens = head_chunk_tokens(vocab, device);
      EXPECT_LE(tokens * vocab * 4, budget) << vocab;
      EXPECT_GT((tokens + 1) * vocab * 4, budget) << vocab;
    }
  }
  EXPECT_EQ(head_chunk_tokens(151936, torch::kCPU), 55);
  EXPECT_EQ(head_chunk_tokens(151936, torch::kCUDA), 883);
  EXPECT_EQ(head_chunk_tokens(kHeadChunkBytesCuda, torch::kCUDA), 1);  // 4 bytes a word over the budget
  EXPECT_THROW(head_chunk_tokens(0), Error);
}

// A chunk costs the same operators whatever its length (and reads the whole weight again): 512 tokens in
// chunks of 8 launch several times the kernels of chunks of 64, forward and backward, for the same values.
// On a GPU each is a launch, which is why a GPU's chunks are 16x longer.
TEST(HeadLogProbs, KernelsFollowTheNumberOfChunksNotTheTokens) {
  const int64_t tokens = 512, hidden = 32, vocab = 256;
  torch::manual_seed(9);
  const auto h0 = torch::randn({tokens, hidden}), w0 = torch::randn({vocab, hidden}) * 0.1;
  const auto targets = torch::randint(0, vocab, {tokens}, torch::kLong);
  auto run = [&](int64_t chunk, testing::OperatorCounts* counts) {
    auto h = h0.clone().set_requires_grad(true), w = w0.clone().set_requires_grad(true);
    TokenLogProbs out;
    {
      testing::OperatorCounter counter;
      out = head_log_probs(h, w, targets, 1.0, true, {}, chunk);
      (out.log_probs.sum() + out.entropy.sum()).backward();
      *counts = counter.counts();
    }
    return std::vector<torch::Tensor>{out.log_probs.detach(), w.grad()};
  };
  testing::OperatorCounts short_counts, long_counts;
  const auto short_out = run(8, &short_counts), long_out = run(64, &long_counts);
  EXPECT_TRUE(torch::allclose(short_out[0], long_out[0], 1e-5, 1e-5));
  EXPECT_TRUE(torch::allclose(short_out[1], long_out[1], 1e-4, 1e-5));
  std::printf("512 tokens: chunks of 8: %lld kernels, %lld operator calls; chunks of 64: %lld kernels, %lld calls\n",
              static_cast<long long>(short_counts.kernels), static_cast<long long>(short_counts.operator_calls),
              static_cast<long long>(long_counts.kernels), static_cast<long long>(long_counts.operator_calls));
  EXPECT_GT(short_counts.kernels, 5 * long_counts.kernels);
  EXPECT_GT(short_counts.operator_calls, 5 * long_counts.operator_calls);
}

TEST(HeadLogProbs, RejectsShapesThatDoNotFit) {
  const Case c = random_case(1, 2, 4, 5, 4);
  EXPECT_THROW(head_log_probs(c.hidden, c.weight.narrow(1, 0, 3), c.targets), Error);
  EXPECT_THROW(head_log_probs(c.hidden, c.weight, c.targets.narrow(1, 0, 1)), Error);
  EXPECT_THROW(head_log_probs(c.hidden, c.weight, c.targets, 0.0), Error);
}

// The backward never holds [tokens, vocabulary] logits: chunks of 16 tokens over a 4096-word vocabulary
// peak far below the full logits' 512 x 4096 x 4 bytes (8 MB), which the unchunked path holds several of.
TEST(HeadLogProbs, PeakMemoryFollowsTheChunkNotTheTokens) {
  const int64_t tokens = 512, hidden = 32, vocab = 4096;
  torch::manual_seed(5);
  auto h = torch::randn({tokens, hidden}).set_requires_grad(true);
  auto w = (torch::randn({vocab, hidden}) * 0.1).set_requires_grad(true);
  auto targets = torch::randint(0, vocab, {tokens}, torch::kLong);
  const int64_t full_logits = tokens * vocab * 4;
  const int64_t chunked = peak_cpu_bytes_during([&] {
    auto out = head_log_probs(h, w, targets, 1.0, true, {}, 16);
    (out.log_probs.sum() + out.entropy.sum()).backward();
  });
  h.mutable_grad() = torch::Tensor();
  w.mutable_grad() = torch::Tensor();
  const int64_t unchunked = peak_cpu_bytes_during([&] {
    auto out = token_log_probs(torch::linear(h, w).unsqueeze(0), targets.unsqueeze(0));
    (out.log_probs.sum() + out.entropy.sum()).backward();
  });
  EXPECT_GT(unchunked, 3 * full_logits);  // the tracker sees what autograd keeps
  // The weight's gradient (and its float32 accumulator) is inherent: 2 x 512 KB. The rest is a few chunks.
  EXPECT_LT(chunked, 2 * w.numel() * 4 + 16 * vocab * 4 * 8) << "unchunked peak " << unchunked;
}

// The weight's gradient is one matmul per group of up to H tokens, not one per chunk: in bf16 a group's
// gradient is the matmul's own bf16 result, with no float32 [V, H] accumulator or converted copy per chunk
// (those made the backward of a 150k vocabulary several times its forward). Several groups still sum to the
// unchunked gradient.
TEST(HeadLogProbs, Bf16WeightGradientIsOneMatmulPerGroupOfTokens) {
  const int64_t hidden = 64, vocab = 4096, chunk = 8;
  const int64_t weight_bytes = vocab * hidden * 2;
  for (int64_t tokens : {hidden, 3 * hidden + 5}) {  // one group; several, a ragged last one
    const std::string what = std::to_string(tokens) + " tokens";
    torch::manual_seed(8);
    auto h = torch::randn({tokens, hidden}).to(torch::kBFloat16).set_requires_grad(true);
    auto w = (torch::randn({vocab, hidden}) * 0.1).to(torch::kBFloat16).set_requires_grad(true);
    auto targets = torch::randint(0, vocab, {tokens}, torch::kLong);
    auto w_lp = torch::randn({tokens});
    auto out = head_log_probs(h, w, targets, 1.0, true, {}, chunk);
    auto loss = (out.log_probs * w_lp).sum();
    const int64_t peak = peak_cpu_bytes_during([&] { loss.backward(); });
    if (tokens <= hidden) {
      // The group's [tokens, V] gradients and the matmul's result (each at most the weight's size) and a few
      // chunks; a float32 accumulator with a converted copy would be 4 x the weight's bytes alone.
      EXPECT_LT(peak, 2 * weight_bytes + 8 * chunk * vocab * 4) << what;
    }
    auto h_full = h.detach().clone().set_requires_grad(true);
    auto w_full = w.detach().clone().set_requires_grad(true);
    auto full = token_log_probs(torch::linear(h_full, w_full).to(torch::kFloat32).unsqueeze(0), targets.unsqueeze(0));
    (full.log_probs.squeeze(0) * w_lp).sum().backward();
    ASSERT_EQ(w.grad().scalar_type(), torch::kBFloat16) << what;
    expect_close(w.grad().to(torch::kFloat), w_full.grad().to(torch::kFloat), 5e-2, what + " d/dweight");
    expect_close(h.grad().to(torch::kFloat), h_full.grad().to(torch::kFloat), 5e-2, what + " d/dhidden");
  }
}

// Under tensor parallelism each of 3 ranks holds a third of the vocabulary rows; the chunked log-probs,
// entropy and gradients equal one process's over the whole vocabulary.
TEST(HeadLogProbs, VocabularyParallelRanksMatchOneProcess) {
  testing::run_ranks(3, [](int rank, int port) {
    Communicator comm(testing::gloo_world(rank, 3, port));
    TensorParallelGroup tp(&comm);
    const Case c = random_case(2, 5, 8, 12, 6);  // identical on every rank
    const Result full = run(c, 0.8, false, 0);
    auto hidden = c.hidden.clone().set_requires_grad(true);
    auto local_weight = c.weight.narrow(0, 4 * rank, 4).clone().set_requires_grad(true);
    auto out = head_log_probs(hidden, local_weight, c.targets, 0.8, true, tp, /*chunk_tokens=*/3);
    expect_close(out.log_probs.detach(), full.log_probs, 1e-5, "tp log-probs");
    expect_close(out.entropy.detach(), full.entropy, 1e-5, "tp entropy");
    ((out.log_probs * c.w_lp).sum() + 0.3 * (out.entropy * c.w_h).sum()).backward();
    // The hidden states' gradient is summed over the ranks by the region's copy (replicated input).
    expect_close(hidden.grad(), full.grad_hidden, 1e-5, "tp d/dhidden");
    expect_close(local_weight.grad(), full.grad_weight.narrow(0, 4 * rank, 4), 1e-5, "tp d/dweight slice");
  });
}

// The optimal token baseline's sum of p^2 over the vocabulary: softmax of the full logits squared and summed,
// in chunks of any size, at a temperature, and over a vocabulary split 3 ways.
torch::Tensor full_sum_pi_squared(const Case& c, double temperature) {
  return torch::softmax(torch::linear(c.hidden, c.weight).to(torch::kFloat32) / temperature, -1).square().sum(-1);
}

TEST(HeadLogProbs, SumPiSquaredIsTheFullSoftmaxsSquaredSum) {
  const Case c = random_case(3, 5, 8, 11, 2);
  for (double temperature : {1.0, 0.7}) {
    const torch::Tensor want = full_sum_pi_squared(c, temperature);
    ASSERT_TRUE((want > 1.0 / 11 - 1e-6).all().item<bool>() && (want <= 1 + 1e-6).all().item<bool>());
    for (int64_t chunk : {1, 4, 15, 0}) {
      const std::string what = "T=" + std::to_string(temperature) + " chunk " + std::to_string(chunk);
      expect_close(head_sum_pi_squared(c.hidden, c.weight, temperature, {}, chunk), want, 1e-6, what);
    }
  }
  // Sharp logits: the sum tends to 1 without overflow.
  Case sharp = c;
  sharp.weight = c.weight * 200;
  expect_close(head_sum_pi_squared(sharp.hidden, sharp.weight), full_sum_pi_squared(sharp, 1.0), 1e-5, "sharp");
}

TEST(HeadLogProbs, SumPiSquaredOfVocabularyParallelRanksMatchesOneProcess) {
  testing::run_ranks(3, [](int rank, int port) {
    Communicator comm(testing::gloo_world(rank, 3, port));
    TensorParallelGroup tp(&comm);
    const Case c = random_case(2, 5, 8, 12, 7);
    const torch::Tensor weight = c.weight.narrow(0, 4 * rank, 4);
    const torch::Tensor got = head_sum_pi_squared(c.hidden, weight, 0.8, tp, 3);
    expect_close(got, full_sum_pi_squared(c, 0.8), 1e-6, "tp sum of p^2");
    // From the log-prob pass's own chunks, over the ranks' slices alike.
    const TokenLogProbs fused = head_log_probs(c.hidden, weight, c.targets, 0.8, true, tp, 3, true);
    EXPECT_TRUE(torch::equal(fused.sum_pi_squared, got)) << "tp: fused " << fused.sum_pi_squared << " separate " << got;
  });
}

// The log-prob pass computes the sum of p^2 from its own chunks' logits (the old log-prob pass of the optimal
// token baseline no longer reads the head twice): bit for bit the separate pass, with and without entropy,
// and the log-probs, entropy and gradients unchanged by asking for it.
TEST(HeadLogProbs, SumPiSquaredFromTheLogProbPassEqualsTheSeparatePass) {
  const Case c = random_case(3, 5, 8, 11, 2);
  for (bool with_entropy : {true, false}) {
    for (int64_t chunk : {1, 4, 0}) {
      const std::string what = std::string(with_entropy ? "with" : "without") + " entropy, chunk " + std::to_string(chunk);
      torch::Tensor hidden = c.hidden.clone().requires_grad_(true);
      torch::Tensor hidden_plain = c.hidden.clone().requires_grad_(true);
      const TokenLogProbs fused = head_log_probs(hidden, c.weight, c.targets, 0.7, with_entropy, {}, chunk, true);
      const TokenLogProbs plain = head_log_probs(hidden_plain, c.weight, c.targets, 0.7, with_entropy, {}, chunk);
      ASSERT_TRUE(fused.sum_pi_squared.defined()) << what;
      EXPECT_FALSE(plain.sum_pi_squared.defined()) << what;
      EXPECT_FALSE(fused.sum_pi_squared.requires_grad()) << what;
      EXPECT_TRUE(torch::equal(fused.sum_pi_squared, head_sum_pi_squared(c.hidden, c.weight, 0.7, {}, chunk))) << what;
      EXPECT_TRUE(torch::equal(fused.log_probs, plain.log_probs)) << what;
      if (with_entropy) {
        EXPECT_TRUE(torch::equal(fused.entropy, plain.entropy)) << what;
      }
      (fused.log_probs * c.w_lp).sum().backward();
      (plain.log_probs * c.w_lp).sum().backward();
      EXPECT_TRUE(torch::equal(hidden.grad(), hidden_plain.grad())) << what;
    }
  }
}

// response_log_probs(model, ...) (the actor's log-prob and loss path) against the full logits of forward().
TEST(HeadLogProbs, ModelResponseLogProbsMatchTheFullForward) {
  ModelConfig config = testing::tiny_model_config({.vocab_size = 40,
                                                    .hidden_size = 16,
                                                    .intermediate_size = 32,
                                                    .num_attention_heads = 2,
                                                    .num_key_value_heads = 1,
                                                    .max_position_embeddings = 64});
  for (bool tied : {false, true}) {
    config.tie_word_embeddings = tied;
    torch::manual_seed(7);
    CausalLM model(config);
    auto ids = torch::randint(3, 40, {3, 9}, torch::kLong);
    auto mask = torch::ones({3, 9}, torch::kLong);
    mask[0].narrow(0, 0, 2).zero_();  // left padding
    mask[2].narrow(0, 7, 2).zero_();  // right padding
    const int64_t response = 4;
    auto chunked = response_log_probs(model, ids, mask, response, 0.9, true);
    (chunked.log_probs.sum() + chunked.entropy.sum()).backward();
    std::vector<torch::Tensor> chunked_grads;
    for (auto& p : model->parameters()) chunked_grads.push_back(p.grad().clone());
    model->zero_grad();
    auto logits = model->forward(ids, mask).logits.narrow(1, 9 - response - 1, response) / 0.9;
    auto full = token_log_probs(logits, ids.narrow(1, 9 - response, response));
    (full.log_probs.sum() + full.entropy.sum()).backward();
    expect_close(chunked.log_probs.detach(), full.log_probs.detach(), 1e-5, "log-probs");
    expect_close(chunked.entropy.detach(), full.entropy.detach(), 1e-5, "entropy");
    auto params = model->parameters();
    for (size_t i = 0; i < params.size(); ++i)
      expect_close(chunked_grads[i], params[i].grad(), 1e-5, "parameter " + std::to_string(i));
  }
}

// The old log-probs (no gradients) and the update's first forward (gradients recorded) run the same arithmetic, so
// they agree bit for bit and PPO's ratio starts at exactly 1; fp32 and a bf16 model, padded rows included. (The GPU's
// version, where both take the fused RMSNorm, is in test_cuda_parity.)
TEST(HeadLogProbs, WithAndWithoutGradientsAreBitForBitEqual) {
  ModelConfig config = testing::tiny_model_config({.vocab_size = 40,
                                                    .hidden_size = 32,
                                                    .intermediate_size = 48,
                                                    .num_attention_heads = 4,
                                                    .num_key_value_heads = 2,
                                                    .max_position_embeddings = 64},
                                                   "qwen3-tiny");
  for (torch::Dtype dtype : {torch::kFloat32, torch::kBFloat16}) {
    torch::manual_seed(8);
    CausalLM model(config);
    model->to(dtype);
    auto ids = torch::randint(3, 40, {3, 11}, torch::kLong);
    auto mask = torch::ones({3, 11}, torch::kLong);
    mask[0].narrow(0, 0, 3).zero_();  // left padding
    mask[2].narrow(0, 9, 2).zero_();  // right padding
    TokenLogProbs old;
    {
      torch::NoGradGuard no_grad;
      old = response_log_probs(model, ids, mask, 5, 0.8, true);
    }
    auto recorded = response_log_probs(model, ids, mask, 5, 0.8, true);
    ASSERT_TRUE(recorded.log_probs.requires_grad());
    const std::string what = dtype == torch::kFloat32 ? "fp32" : "bf16";
    EXPECT_TRUE(torch::equal(old.log_probs, recorded.log_probs.detach())) << what;
    EXPECT_TRUE(torch::equal(old.entropy, recorded.entropy.detach())) << what;
  }
}

}  // namespace
}  // namespace hybridflow
