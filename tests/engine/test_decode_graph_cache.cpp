// Pools (and, on a GPU, their CUDA graphs) kept from one generate() call to the next
// (GenerationConfig::decode_graph_cache, engine/decode_graph_cache.h): on the CPU the pools alone are kept,
// which runs every step of taking, adopting and keeping them that graphs go through.
#include "hybridflow/engine/decode_graph_cache.h"

#include <gtest/gtest.h>

#include "hybridflow/engine/generation.h"
#include "support/tiny_model.h"

namespace hybridflow {
namespace {

class DecodeGraphCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    at::set_num_threads(1);
    torch::manual_seed(5);
    model = CausalLM(testing::tiny_model_config({.vocab_size = 53, .hidden_size = 32, .intermediate_size = 48},
                                                "qwen2-tiny"));
    torch::NoGradGuard no_grad;
    for (auto& p : model->parameters())
      if (p.dim() == 2) p.mul_(6.0);  // spread logits: no near ties between the runs compared
    cfg.max_new_tokens = 12;
    cfg.n = 3;
    cfg.seed = 7;
    cfg.eos_token_ids = {4};
    cfg.decode_graph_cache = cache;
  }
  GenerationConfig without_cache() const {
    GenerationConfig plain = cfg;
    plain.decode_graph_cache = nullptr;
    return plain;
  }
  CausalLM model{nullptr};
  GenerationConfig cfg;
  std::shared_ptr<DecodeGraphCache> cache = std::make_shared<DecodeGraphCache>();
  std::vector<std::vector<int64_t>> first = {{5, 9, 2, 30, 7}, {1, 12}}, second = {{40, 3, 3}, {8, 8, 21, 6}};
};

void expect_same(const GenerationOutput& a, const GenerationOutput& b) {
  EXPECT_TRUE(torch::equal(a.responses, b.responses));
  EXPECT_TRUE(torch::equal(a.response_mask, b.response_mask));
  EXPECT_TRUE(torch::allclose(a.log_probs, b.log_probs, 1e-5, 1e-5));
}

// The second call decodes on the first call's pools (their old keys and values beside its own) and samples
// exactly what it samples on new pools.
TEST_F(DecodeGraphCacheTest, TheNextCallTakesThePoolsAndSamplesTheSame) {
  const GenerationOutput a = generate(model, first, cfg);
  EXPECT_FALSE(a.kv_cache.kept_pools);
  ASSERT_TRUE(cache->holds());
  EXPECT_EQ(cache->graphs(), 0);  // the CPU: pools only
  const GenerationOutput b = generate(model, second, cfg);
  EXPECT_TRUE(b.kv_cache.kept_pools);
  EXPECT_EQ(b.kv_cache.pool_blocks, a.kv_cache.pool_blocks);  // the kept pool, at least what b needs
  expect_same(b, generate(model, second, without_cache()));
  expect_same(a, generate(model, first, without_cache()));
  // Again: the set went back after b.
  EXPECT_TRUE(generate(model, first, cfg).kv_cache.kept_pools);
  EXPECT_EQ(generate(model, first, without_cache()).kv_cache.kept_pools, false);
}

// A call the kept set does not fit drops it and makes its own, which the next call then takes.
TEST_F(DecodeGraphCacheTest, WhatTheKeptSetCannotHoldGetsNewPools) {
  generate(model, first, cfg);
  GenerationConfig longer = cfg;
  longer.max_new_tokens = 40;  // more blocks and a longer span than the kept set was made for
  const GenerationOutput grown = generate(model, first, longer);
  EXPECT_FALSE(grown.kv_cache.kept_pools);
  expect_same(grown, generate(model, first, [&] {
                GenerationConfig plain = longer;
                plain.decode_graph_cache = nullptr;
                return plain;
              }()));
  // The larger set holds the shorter call.
  const GenerationOutput shorter = generate(model, second, cfg);
  EXPECT_TRUE(shorter.kv_cache.kept_pools);
  EXPECT_EQ(shorter.kv_cache.pool_blocks, grown.kv_cache.pool_blocks);
  expect_same(shorter, generate(model, second, without_cache()));
}

// Another draw, weights that moved, another model or an emptied cache: new pools.
TEST_F(DecodeGraphCacheTest, ADifferentFingerprintGetsNewPools) {
  generate(model, first, cfg);
  GenerationConfig hotter = cfg;
  hotter.temperature = 0.7;
  EXPECT_FALSE(generate(model, first, hotter).kv_cache.kept_pools);
  EXPECT_TRUE(generate(model, first, hotter).kv_cache.kept_pools);
  EXPECT_FALSE(generate(model, first, cfg).kv_cache.kept_pools);
  {
    torch::NoGradGuard no_grad;
    // Updated in place (an optimizer step): the same addresses, kept.
    model->parameters().front().add_(0.01);
  }
  EXPECT_TRUE(generate(model, first, cfg).kv_cache.kept_pools);
  {
    torch::NoGradGuard no_grad;
    auto& p = model->parameters().back();
    p.set_data(p.detach().clone());  // a weight made again elsewhere: graphs would read the old one
  }
  EXPECT_FALSE(generate(model, first, cfg).kv_cache.kept_pools);
  torch::manual_seed(5);
  CausalLM other(testing::tiny_model_config({.vocab_size = 53, .hidden_size = 32, .intermediate_size = 48},
                                            "qwen2-tiny"));
  EXPECT_FALSE(generate(other, first, cfg).kv_cache.kept_pools);
  cache->clear();
  EXPECT_FALSE(cache->holds());
  EXPECT_FALSE(generate(other, first, cfg).kv_cache.kept_pools);
}

TEST(DecodeGraphFingerprint, NamesWhatGraphsRead) {
  torch::manual_seed(1);
  CausalLM model(testing::tiny_model_config({.vocab_size = 31, .hidden_size = 16, .intermediate_size = 24},
                                            "qwen2-tiny"));
  GenerationConfig cfg;
  const auto base = decode_graph_fingerprint(model, cfg);
  EXPECT_EQ(decode_graph_fingerprint(model, cfg), base);
  for (auto change : std::vector<std::function<void(GenerationConfig&)>>{
           [](GenerationConfig& c) { c.greedy = true; }, [](GenerationConfig& c) { c.top_k = 5; },
           [](GenerationConfig& c) { c.top_p = 0.9; }, [](GenerationConfig& c) { c.sampleable_vocab_size = 20; },
           [](GenerationConfig& c) { c.kv_block_size = 8; }, [](GenerationConfig& c) { c.cuda_graphs = true; },
           [](GenerationConfig& c) { c.pad_token_id = 3; }}) {
    GenerationConfig changed = cfg;
    change(changed);
    EXPECT_NE(decode_graph_fingerprint(model, changed), base);
  }
  // What the draw does not read leaves it alone.
  GenerationConfig same = cfg;
  same.seed = 99;
  same.n = 4;
  same.max_new_tokens = 3;
  same.eos_token_ids = {1, 2};
  EXPECT_EQ(decode_graph_fingerprint(model, same), base);
  model->to(torch::kBFloat16);
  EXPECT_NE(decode_graph_fingerprint(model, cfg), base);
}

}  // namespace
}  // namespace hybridflow
