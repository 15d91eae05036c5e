// Prefix caching in continuous batching on the paged cache (GenerationConfig::enable_prefix_caching): prompts
// that begin with the same whole blocks start on the blocks of the first one prefilled and prefill only the
// rest, and generate what they generate with prefix caching off.
#include <gtest/gtest.h>

#include "hybridflow/engine/generation.h"
#include "hybridflow/model/batch_invariant.h"
#include "support/tiny_model.h"

namespace hybridflow {
namespace {

CausalLM spread_model() {
  torch::manual_seed(11);
  CausalLM model(testing::tiny_model_config({.vocab_size = 41, .hidden_size = 32, .intermediate_size = 48}, "qwen2-tiny"));
  torch::NoGradGuard no_grad;
  for (auto& p : model->parameters())
    if (p.dim() == 2) p.mul_(10.0);  // spread logits: sampled choices are not near ties
  return model;
}

// Blocks of 4: b shares a's first 2 blocks, c only the first; d shares nothing and is too short to be found;
// the second a finds 2 blocks (its last position is always prefilled).
const std::vector<int64_t> kA = {5, 9, 2, 20, 21, 22, 23, 24, 33, 34, 35}, kB = {5, 9, 2, 20, 21, 22, 23, 24, 36, 37},
                           kC = {5, 9, 2, 20, 25, 26, 27, 28, 29}, kD = {6, 1, 2};

GenerationConfig sampled_config() {
  GenerationConfig cfg;
  cfg.temperature = 1.0;
  cfg.seed = 7;
  cfg.n = 2;
  cfg.max_new_tokens = 6;
  cfg.kv_block_size = 4;
  return cfg;
}

// The prompts generated with prefix caching off, then on, under the batch-invariant kernels: the same tokens
// and log-probs bit for bit.
std::pair<GenerationOutput, GenerationOutput> off_and_on(CausalLM& model, const std::vector<std::vector<int64_t>>& prompts,
                                                         GenerationConfig cfg) {
  cfg.enable_prefix_caching = false;
  GenerationOutput off = generate(model, prompts, cfg);
  cfg.enable_prefix_caching = true;
  GenerationOutput on = generate(model, prompts, cfg);
  EXPECT_TRUE(torch::equal(on.responses, off.responses));
  EXPECT_TRUE(torch::equal(on.log_probs, off.log_probs));
  return {std::move(off), std::move(on)};
}

TEST(GenerationPrefixCache, PromptsThatBeginAlikeStartOnTheFirstOnesBlocksAndGenerateTheSame) {
  at::set_num_threads(1);
  CausalLM model = spread_model();
  const std::vector<std::vector<int64_t>> prompts = {kA, kB, kC, kD, kA};
  for (const bool exact : {true, false}) {
    SCOPED_TRACE(exact ? "batch-invariant kernels" : "default kernels");
    BatchInvariantGuard kernels(exact);
    GenerationConfig cfg = sampled_config();
    cfg.enable_prefix_caching = false;
    const GenerationOutput off = generate(model, prompts, cfg);
    cfg.enable_prefix_caching = true;
    const GenerationOutput on = generate(model, prompts, cfg);
    EXPECT_TRUE(torch::equal(on.responses, off.responses));
    if (exact)
      EXPECT_TRUE(torch::equal(on.log_probs, off.log_probs));
    else
      EXPECT_TRUE(torch::allclose(on.log_probs, off.log_probs, 1e-5, 1e-5))
          << (on.log_probs - off.log_probs).abs().max().item<float>();
    // a is prefilled first, alone (b would find more of it); then b, c, d and the second a together, on a's
    // blocks: 8 + 4 + 0 + 8 positions found, and that many blocks fewer held while all run at once.
    EXPECT_EQ(off.prefills, 1);
    EXPECT_EQ(on.prefills, 2);
    EXPECT_EQ(off.kv_cache.prefix_cached_tokens, 0);
    EXPECT_EQ(on.kv_cache.prefix_cached_tokens, 8 + 4 + 8);
    EXPECT_EQ(off.kv_cache.peak_blocks - on.kv_cache.peak_blocks, (8 + 4 + 8) / 4);
  }
}

// Fewer slots than samples: b, held back from a's admission (it would find more of a), joins in the next pass
// beside a's running samples and finds a's blocks; c waits for free slots, which come when a's and b's samples
// end together and free their blocks: the pool retains a's (recorded, and not needed since), so c still finds
// a's first block. The answers are those of prefix caching off.
TEST(GenerationPrefixCache, APromptFindsTheBlocksOfSequencesThatEndedWhileThePoolRetainsThem) {
  at::set_num_threads(1);
  CausalLM model = spread_model();
  BatchInvariantGuard exact(true);
  GenerationConfig cfg = sampled_config();
  cfg.max_num_seqs = 4;     // two prompts' samples at once
  cfg.admission_rows = 0;   // a prompt joins as soon as its samples fit
  const std::vector<std::vector<int64_t>> prompts = {kA, kB, kC};
  const auto [off, on] = off_and_on(model, prompts, cfg);
  EXPECT_EQ(off.prefills, 2);  // a and b, then c
  EXPECT_EQ(on.prefills, 3);   // a, b, then c
  EXPECT_EQ(on.kv_cache.prefix_cached_tokens, 8 + 4);
}

// A pool with room for about one prompt's samples at a time: each prompt waits for blocks of the one before,
// and starts on its blocks, held by a sample still running or retained after both ended. a, then the second
// a (finds a's 2 blocks), then b (finds them again), then c (a's first block). Same answers as prefix caching
// off.
TEST(GenerationPrefixCache, PromptsRunOneAfterAnotherStartOnTheRetainedBlocks) {
  at::set_num_threads(1);
  CausalLM model = spread_model();
  BatchInvariantGuard exact(true);
  GenerationConfig cfg = sampled_config();
  cfg.admission_rows = 0;
  // a's worst case: 3 prompt blocks + 2 samples x (4 - 3 + 1) = 7; the next prompt's 5 or more new ones fit
  // beside it only once one of its samples has ended.
  cfg.kv_cache_blocks = 11;
  const std::vector<std::vector<int64_t>> prompts = {kA, kA, kB, kC};
  const auto [off, on] = off_and_on(model, prompts, cfg);
  EXPECT_EQ(off.prefills, 4);
  EXPECT_EQ(on.prefills, 4);
  EXPECT_EQ(off.kv_cache.prefix_cached_tokens, 0);
  EXPECT_EQ(on.kv_cache.prefix_cached_tokens, 8 + 8 + 4);
}

// Partial rollouts swap the weights between chunks: cached keys would be stale, so nothing is found.
TEST(GenerationPrefixCache, NothingIsFoundAcrossAWeightRefresh) {
  at::set_num_threads(1);
  CausalLM model = spread_model();
  GenerationConfig cfg = sampled_config();
  cfg.refresh_weights = [] { return int64_t{0}; };
  const GenerationOutput out = generate(model, {kA, kB, kA}, cfg);
  EXPECT_EQ(out.kv_cache.prefix_cached_tokens, 0);
  EXPECT_EQ(out.prefills, 1);
}

}  // namespace
}  // namespace hybridflow
