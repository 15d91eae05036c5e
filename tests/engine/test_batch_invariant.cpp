// Batch-invariant mode (model/batch_invariant.h): the log-probs generation records while decoding with a KV
// cache equal, bit for bit, the log-probs a full forward recomputes for the same tokens, whatever the batch
// around a sequence (alone, 3 rows, 64 rows), its padding (left, right, none), the generation path (continuous
// batching on slots or paged blocks, the static batch, recomputation without a cache) or the thread count.
// Without the mode they differ.
#include "hybridflow/model/batch_invariant.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "hybridflow/core/error.h"
#include "hybridflow/engine/generation.h"
#include "hybridflow/engine/head_log_probs.h"
#include "hybridflow/kernels/batch_invariant_kernels.h"
#include "support/batch_invariant_layouts.h"
#include "support/error_of.h"

namespace hybridflow {
namespace {

using namespace testing::batch_invariant_layouts;

class BatchInvariantRollout : public ::testing::TestWithParam<RolloutCase> {};

TEST_P(BatchInvariantRollout, RecordedLogProbsEqualEveryRecomputationBitForBit) {
  expect_recorded_equal_every_recomputation(GetParam(), torch::kCPU);
}

INSTANTIATE_TEST_SUITE_P(Paths, BatchInvariantRollout, ::testing::ValuesIn(rollout_cases()), rollout_case_name);

// The same sequences generated and scored in the ordinary mode: the recorded and the recomputed log-probs
// disagree somewhere (the decode step's one-row kernels and the cache's attention reduce in other orders than a
// whole-sequence forward's matrix products).
TEST(BatchInvariantOff, RecordedLogProbsDifferFromRecomputation) {
  CausalLM model = make_model("tiny");
  const auto samples = samples_of(generate(model, kPrompts, sampling(true, true, 0, 2)));
  int differing = 0, compared = 0;
  for (const auto& layout : every_layout(model, samples))
    for (size_t q = 0; q < samples.size(); ++q)
      for (size_t t = 0; t < samples[q].rollout.size(); ++t, ++compared)
        differing += layout[q][t] != samples[q].rollout[t] ? 1 : 0;
  EXPECT_GT(differing, 0) << "of " << compared;
  std::printf("ordinary mode: %d of %d recomputed log-probs differ from the recorded ones\n", differing, compared);
}

// Ordinary mode and batch-invariant mode compute the same function: close, not equal.
TEST(BatchInvariant, LogProbsCloseToOrdinaryMode) {
  CausalLM model = make_model("qwen2-tiny");
  const auto samples = samples_of(generate(model, kPrompts, sampling(true, true, 0, 1)));
  std::vector<size_t> all;
  for (size_t i = 0; i < samples.size(); ++i) all.push_back(i);
  const auto ordinary = recompute(model, samples, all, 0, 0);
  BatchInvariantGuard on;
  const auto invariant = recompute(model, samples, all, 0, 0);
  for (size_t q = 0; q < samples.size(); ++q)
    for (size_t t = 0; t < samples[q].response.size(); ++t) EXPECT_NEAR(invariant[q][t], ordinary[q][t], 2e-4);
}

TEST(BatchInvariant, ThreadCountDoesNotChangeTheResult) {
  CausalLM model = make_model("tiny");
  BatchInvariantGuard on;
  const int threads = at::get_num_threads();
  const auto samples = samples_of(generate(model, kPrompts, sampling(true, true, 0, 2)));
  std::vector<size_t> all;
  for (size_t i = 0; i < samples.size(); ++i) all.push_back(i);
  at::set_num_threads(1);
  const auto one = recompute(model, samples, all, 0, 0);
  at::set_num_threads(std::max(2, threads));
  const auto several = recompute(model, samples, all, 0, 0);
  at::set_num_threads(threads);
  EXPECT_EQ(one, several);
}

TEST(BatchInvariant, EntropyAndGuardScope) {
  CausalLM model = make_model("tiny");
  torch::NoGradGuard no_grad;
  auto hidden = torch::randn({3, 5, 64});
  auto targets = torch::randint(0, 61, {3, 5});
  TokenLogProbs ordinary = head_log_probs(hidden, model->lm_head_weight(), targets, 1.3, true);
  TokenLogProbs invariant;
  {
    BatchInvariantGuard on;
    EXPECT_TRUE(batch_invariant_active());
    {
      torch::AutoGradMode grad(true);
      EXPECT_FALSE(batch_invariant_active());  // passes with gradients keep the ordinary kernels
    }
    invariant = head_log_probs(hidden, model->lm_head_weight(), targets, 1.3, true);
    // Row 4 of token 1 alone gives what it gave inside the batch.
    TokenLogProbs one = head_log_probs(hidden[1].narrow(0, 4, 1), model->lm_head_weight(), targets[1].narrow(0, 4, 1),
                                       1.3, true);
    EXPECT_EQ(one.log_probs[0].item<float>(), invariant.log_probs[1][4].item<float>());
    EXPECT_EQ(one.entropy[0].item<float>(), invariant.entropy[1][4].item<float>());
  }
  EXPECT_FALSE(batch_invariant_active());
  EXPECT_TRUE(torch::allclose(invariant.log_probs, ordinary.log_probs, 1e-4, 1e-5));
  EXPECT_TRUE(torch::allclose(invariant.entropy, ordinary.entropy, 1e-4, 1e-5));
}

TEST(BatchInvariant, RefusesWhatItDoesNotCover) {
  torch::manual_seed(1);
  CausalLM moe(testing::tiny_model_config({.vocab_size = 61, .hidden_size = 64, .intermediate_size = 96},
                                          "qwen3-moe-tiny"));
  BatchInvariantGuard on;
  torch::NoGradGuard no_grad;
  auto ids = torch::randint(0, 61, {2, 4});
  try {
    moe->hidden_states(ids, torch::ones({2, 4}, torch::kInt64));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rollout.batch_invariant"), std::string::npos) << e.what();
  }
}

// The dispatch: CPU tensors keep the CPU kernels (the tests above); the CUDA kernels take CUDA tensors only and
// say so naming the key, and a build without them (HF_CUDA unset) has none to take.
TEST(BatchInvariant, CudaKernelsTakeOnlyCudaTensorsAndNameTheKey) {
#ifdef HF_WITH_CUDA
  EXPECT_TRUE(kernels::batch_invariant::built());
#else
  EXPECT_FALSE(kernels::batch_invariant::built());
#endif
  namespace kb = kernels::batch_invariant;
  const auto x = torch::randn({2, 8}), w = torch::randn({3, 8});
  auto gate = torch::randn({4});
  for (const std::string& message :
       {testing::error_of([&] { kb::linear(x, w); }), testing::error_of([&] { kb::rms_norm(x, x[0], 1e-6); }),
        testing::error_of([&] { kb::swiglu_(gate, gate); }),
        testing::error_of([&] { kb::token_log_probs(x, torch::zeros({2}, torch::kInt64), 1.0, true); })}) {
    EXPECT_NE(message.find("actor_rollout_ref.rollout.batch_invariant"), std::string::npos) << message;
    EXPECT_NE(message.find("takes CUDA tensors"), std::string::npos) << message;
  }
  EXPECT_TRUE(batch_invariant::linear(x, w).device().is_cpu());
}

// Outside float32 the mode refuses, naming the key (the kernels of both halves are float32).
TEST(BatchInvariant, RefusesBf16NamingTheKey) {
  CausalLM model = make_model("tiny");
  model->to(torch::kBFloat16);
  BatchInvariantGuard on;
  torch::NoGradGuard no_grad;
  const std::string message =
      testing::error_of([&] { model->hidden_states(torch::randint(0, 61, {2, 4}), torch::ones({2, 4}, torch::kInt64)); });
  EXPECT_NE(message.find("actor_rollout_ref.rollout.batch_invariant"), std::string::npos) << message;
  EXPECT_NE(message.find("float32"), std::string::npos) << message;
}

}  // namespace
}  // namespace hybridflow
