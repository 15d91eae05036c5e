// Decode steps read back in chunks (GenerationConfig::readback_interval): sampling, eos checks and the
// finished-row mask stay on the device between reads, and every interval returns the tokens and log-probs
// of interval 1 - greedy and seeded sampling, eos and max_new_tokens inside a chunk, continuous batching
// admitting rows as others end, on every path - with one read of the device per chunk.
#include <gtest/gtest.h>

#include <limits>
#include <string>

#include "engine/generation_steps.h"
#include "hybridflow/core/error.h"
#include "hybridflow/engine/generation.h"
#include "hybridflow/model/batch_invariant.h"
#include "support/tiny_model.h"

namespace hybridflow {
namespace {

class DecodeReadbackTest : public ::testing::Test {
 protected:
  void SetUp() override {
    at::set_num_threads(1);
    torch::manual_seed(23);
    model = CausalLM(
        testing::tiny_model_config({.vocab_size = 41, .hidden_size = 32, .intermediate_size = 48}, "qwen2-tiny"));
    torch::NoGradGuard no_grad;
    for (auto& p : model->parameters())
      if (p.dim() == 2) p.mul_(10.0);  // spread logits: no near ties between greedy candidates
  }
  CausalLM model{nullptr};
  std::vector<std::vector<int64_t>> prompts = {{5, 9, 2, 30, 7}, {1, 12}, {40, 3, 3}, {8}};
};

struct Path {
  const char* name;
  bool use_kv_cache, continuous_batching, paged_kv_cache;
  int64_t max_num_seqs;
};

// Continuous batching with fewer slots than sequences admits a prompt's samples whenever others end.
const Path kPaths[] = {{"paged", true, true, true, 2},
                       {"paged, every sequence at once", true, true, true, 0},
                       {"slots", true, true, false, 4},
                       {"static batch", true, false, true, 0},
                       {"recomputation", false, false, true, 0}};

GenerationConfig config_for(const Path& path, bool greedy) {
  GenerationConfig cfg;
  cfg.use_kv_cache = path.use_kv_cache;
  cfg.continuous_batching = path.continuous_batching;
  cfg.paged_kv_cache = path.paged_kv_cache;
  cfg.kv_block_size = 4;
  cfg.max_num_seqs = path.max_num_seqs;
  cfg.n = 2;
  cfg.max_new_tokens = 13;  // not a multiple of the intervals: max_new_tokens falls inside a chunk
  cfg.greedy = greedy;
  cfg.temperature = 1.3;
  cfg.top_k = 30;
  cfg.top_p = 0.95;
  cfg.seed = 77;
  return cfg;
}

// The same tokens, bit for bit. The log-probs too under the batch-invariant kernels; with the ordinary ones
// a row's matmuls round with the batch's row count (rows that ended stay in the batch until their chunk
// is read back, as rows of other sequences come and go at any interval), so they agree to float rounding.
void expect_same_output(const GenerationOutput& a, const GenerationOutput& b, const std::string& what) {
  EXPECT_TRUE(torch::equal(a.responses, b.responses)) << what;
  EXPECT_TRUE(torch::equal(a.response_mask, b.response_mask)) << what;
  if (batch_invariant_active())
    EXPECT_TRUE(torch::equal(a.log_probs, b.log_probs)) << what;
  else
    EXPECT_TRUE(torch::allclose(a.log_probs, b.log_probs, 0, 1e-5))
        << what << ": max difference " << (a.log_probs - b.log_probs).abs().max().item<float>();
}

// An id that sequence 0 draws as its third token and that some other sequence never draws in the first
// max_new_tokens: as eos it ends rows mid-chunk at different steps.
int64_t eos_inside_chunks(const GenerationOutput& free_run) {
  const auto responses = free_run.responses.to(torch::kCPU);
  for (int64_t t = 2; t < responses.size(1); ++t) {
    const int64_t id = responses[0][t].item<int64_t>();
    if ((responses == id).any(1).logical_not().any().item<bool>()) return id;
  }
  return -1;
}

void every_interval_returns_the_tokens_of_interval_one(CausalLM& model,
                                                       const std::vector<std::vector<int64_t>>& prompts) {
  for (const Path& path : kPaths)
    for (bool greedy : {true, false}) {
      GenerationConfig cfg = config_for(path, greedy);
      const GenerationOutput free_run = generate(model, prompts, cfg);
      const int64_t eos = eos_inside_chunks(free_run);
      ASSERT_GE(eos, 0) << path.name;
      cfg.eos_token_ids = {eos};
      const GenerationOutput one = generate(model, prompts, cfg);
      // The eos ends some sequences early and leaves others to max_new_tokens.
      const auto lengths = one.response_mask.sum(1);
      ASSERT_LT(lengths.min().item<int64_t>(), cfg.max_new_tokens) << path.name;
      ASSERT_EQ(lengths.max().item<int64_t>(), cfg.max_new_tokens) << path.name;
      for (int64_t interval : {2, 3, 8, 64}) {
        cfg.readback_interval = interval;
        const std::string what =
            std::string(path.name) + (greedy ? ", greedy" : ", sampled") + ", interval " + std::to_string(interval);
        expect_same_output(one, generate(model, prompts, cfg), what);
        cfg.eos_token_ids.clear();
        expect_same_output(free_run, generate(model, prompts, cfg), what + ", no eos");
        cfg.eos_token_ids = {eos};
      }
    }
}

TEST_F(DecodeReadbackTest, EveryIntervalReturnsTheTokensOfIntervalOne) {
  every_interval_returns_the_tokens_of_interval_one(model, prompts);
}

TEST_F(DecodeReadbackTest, EveryIntervalReturnsTheLogProbsOfIntervalOneOnBatchInvariantKernels) {
  BatchInvariantGuard on;
  every_interval_returns_the_tokens_of_interval_one(model, prompts);
}

// The generator reads the device once per chunk of decode steps (and once per admission's first tokens).
TEST_F(DecodeReadbackTest, OneHostSynchronisationPerChunk) {
  for (const Path& path : kPaths) {
    GenerationConfig cfg = config_for(path, /*greedy=*/true);
    cfg.max_new_tokens = 17;
    cfg.max_num_seqs = 0;  // one admission
    const GenerationOutput one = generate(model, prompts, cfg);
    cfg.readback_interval = 8;
    const GenerationOutput eight = generate(model, prompts, cfg);
    expect_same_output(one, eight, path.name);
    if (path.use_kv_cache && path.continuous_batching) {
      // The prefill draws token 1 (one read); 16 decode steps follow, in 16 chunks, then in 2.
      EXPECT_EQ(one.decode_steps, 16) << path.name;
      EXPECT_EQ(one.host_syncs, 17) << path.name;
      EXPECT_EQ(eight.decode_steps, 16) << path.name;
      EXPECT_EQ(eight.host_syncs, 3) << path.name;
    } else {
      // 17 steps of the static batch (the first the prefill): chunks of 8, 8 and 1.
      EXPECT_EQ(one.decode_steps, 17) << path.name;
      EXPECT_EQ(one.host_syncs, 17) << path.name;
      EXPECT_EQ(eight.decode_steps, 17) << path.name;
      EXPECT_EQ(eight.host_syncs, 3) << path.name;
    }
  }
}

// With rows ending and joining, the chunks still cost one read each: far fewer reads than steps.
TEST_F(DecodeReadbackTest, ContinuousBatchingRefillsReadBackPerChunk) {
  GenerationConfig cfg = config_for(kPaths[0], /*greedy=*/false);
  cfg.max_new_tokens = 24;
  cfg.eos_token_ids = {eos_inside_chunks(generate(model, prompts, cfg))};
  const GenerationOutput one = generate(model, prompts, cfg);
  cfg.readback_interval = 8;
  const GenerationOutput eight = generate(model, prompts, cfg);
  expect_same_output(one, eight, "refills");
  // 4 admissions of one prompt's 2 samples each (2 slots): one read each, the rest one per decode step...
  EXPECT_EQ(one.host_syncs, 4 + one.decode_steps);
  // ...and one per chunk of at most 8 steps: at least steps / 8 chunks, fewer reads than a third of the steps.
  EXPECT_GE(eight.host_syncs, 4 + (eight.decode_steps + 7) / 8);
  EXPECT_LT(eight.host_syncs - 4, (eight.decode_steps + 2) / 3);
}

TEST_F(DecodeReadbackTest, IntervalBelowOneIsRejected) {
  GenerationConfig cfg;
  cfg.readback_interval = 0;
  try {
    generate(model, prompts, cfg);
    FAIL() << "readback_interval 0 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("readback_interval"), std::string::npos) << e.what();
  }
}

// A row without a finite distribution is reported when its step is read back, not drawn silently.
TEST(DecodeReadbackSampling, NoFiniteDistributionIsAnError) {
  GenerationConfig cfg;
  auto logits = torch::randn({3, 11});
  logits[1].fill_(std::numeric_limits<float>::quiet_NaN());
  try {
    sample_next_tokens(logits, cfg, {0.1, 0.2, 0.3});
    FAIL() << "NaN logits sampled";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("row 1 has no finite sampling distribution"), std::string::npos) << e.what();
  }
}

// TokenRing::store() leaves to the read-back what record() computes on the device step by step: for the
// same draws both read back the same chunk - an eos ends a row mid-chunk (its later tokens do not count, an
// eos after another counts once), a row with no mass after its eos is no error - and a counted draw without
// mass is reported naming its row. A ring takes one of the two.
TEST(TokenRingStore, ReadsBackWhatRecordComputes) {
  GenerationConfig cfg;
  cfg.eos_token_ids = {7, 9};
  const auto i64 = torch::TensorOptions().dtype(torch::kInt64);
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32);
  const auto flag = torch::TensorOptions().dtype(torch::kBool);
  // 4 rows x 3 steps: row 0 ends at step 1, row 1 never, row 2 at step 0 then draws eos again, row 3 at step 2.
  const std::vector<torch::Tensor> tokens = {torch::tensor({4, 5, 9, 6}, i64), torch::tensor({7, 5, 7, 6}, i64),
                                             torch::tensor({8, 5, 1, 9}, i64)};
  const std::vector<torch::Tensor> log_probs = {torch::tensor({-0.5f, -1.25f, -2.0f, -0.125f}, f32),
                                                torch::tensor({-3.0f, -0.25f, -1.5f, -0.75f}, f32),
                                                torch::tensor({-1.0f, -2.5f, -0.0625f, -4.0f}, f32)};
  // Row 2 has no mass at step 1, past its eos: not counted.
  const std::vector<torch::Tensor> no_mass = {torch::tensor({false, false, false, false}, flag),
                                              torch::tensor({false, false, true, false}, flag),
                                              torch::tensor({false, false, false, false}, flag)};
  generation::TokenRing recorded(4, 3, cfg, torch::kCPU), stored(4, 3, cfg, torch::kCPU);
  for (int64_t k = 0; k < 3; ++k) {
    recorded.record(k, tokens[k], log_probs[k], no_mass[k]);
    stored.store(k, tokens[k], log_probs[k], no_mass[k]);
  }
  const auto a = recorded.read_back(), b = stored.read_back();
  EXPECT_TRUE(torch::equal(a.tokens, b.tokens));
  EXPECT_TRUE(torch::equal(a.log_probs, b.log_probs));
  EXPECT_TRUE(torch::equal(a.live, b.live)) << a.live << b.live;
  EXPECT_TRUE(torch::equal(a.ended, b.ended)) << a.ended << b.ended;
  EXPECT_TRUE(torch::equal(b.live, torch::tensor({true, true, true, true, true, true, false, true, false, true,
                                                  false, true},
                                                 flag)
                                       .view({3, 4})));
  EXPECT_TRUE(torch::equal(b.ended, torch::tensor({true, false, true, true}, flag)));
  EXPECT_TRUE(torch::equal(b.log_probs, torch::stack(log_probs)));

  // Row 3 has no mass at step 1, where its token counts.
  generation::TokenRing lost(4, 3, cfg, torch::kCPU);
  for (int64_t k = 0; k < 3; ++k)
    lost.store(k, tokens[k], log_probs[k], k == 1 ? torch::tensor({false, false, true, true}, flag) : no_mass[k]);
  try {
    lost.read_back();
    FAIL() << "a counted draw without mass was read back";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("row 3 has no finite sampling distribution"), std::string::npos) << e.what();
  }
  generation::TokenRing mixed(4, 3, cfg, torch::kCPU);
  mixed.store(0, tokens[0], log_probs[0], no_mass[0]);
  EXPECT_THROW(mixed.record(1, tokens[1], log_probs[1], no_mass[1]), Error);
}

}  // namespace
}  // namespace hybridflow
