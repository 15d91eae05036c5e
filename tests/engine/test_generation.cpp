#include "hybridflow/engine/generation.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "hybridflow/core/error.h"
#include "hybridflow/engine/decode_graphs.h"
#include "hybridflow/kernels/decode_kernels.h"
#include "hybridflow/model/batch_invariant.h"
#include "support/forward_log_probs.h"
#include "support/paged_generation_case.h"
#include "support/tiny_model.h"

namespace hybridflow {
namespace {

ModelConfig test_config() {
  return testing::tiny_model_config({.vocab_size = 41, .hidden_size = 32, .intermediate_size = 48}, "qwen2-tiny");
}

class GenerationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    at::set_num_threads(1);
    torch::manual_seed(11);
    model = CausalLM(test_config());
    {
      // Larger weights than HF's init so that logits are spread and greedy/sampled choices are not near ties.
      torch::NoGradGuard no_grad;
      for (auto& p : model->parameters())
        if (p.dim() == 2) p.mul_(10.0);
    }
  }
  CausalLM model{nullptr};
  std::vector<std::vector<int64_t>> prompts = {{5, 9, 2, 30, 7}, {1, 12}, {40, 3, 3}};
};

std::vector<int64_t> row(const torch::Tensor& t, int64_t r) {
  auto x = t[r].contiguous().to(torch::kInt64);
  return std::vector<int64_t>(x.data_ptr<int64_t>(), x.data_ptr<int64_t>() + x.numel());
}

using testing::recomputed_log_probs;

TEST_F(GenerationTest, GreedyAloneEqualsInsidePaddedBatch) {
  GenerationConfig cfg;
  cfg.greedy = true;
  cfg.max_new_tokens = 8;
  auto batch = generate(model, prompts, cfg);
  ASSERT_EQ(batch.prompts.sizes(), (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(row(batch.prompts, 1), (std::vector<int64_t>{0, 0, 0, 1, 12}));
  EXPECT_EQ(row(batch.prompt_mask, 1), (std::vector<int64_t>{0, 0, 0, 1, 1}));
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto alone = generate(model, {prompts[i]}, cfg);
    EXPECT_EQ(row(alone.responses, 0), row(batch.responses, i)) << "prompt " << i;
    EXPECT_TRUE(torch::allclose(alone.log_probs[0], batch.log_probs[i], 1e-4, 1e-4)) << "prompt " << i;
  }
}

TEST_F(GenerationTest, SeedMakesSamplingReproducible) {
  GenerationConfig cfg;
  cfg.max_new_tokens = 10;
  cfg.temperature = 1.5;
  cfg.seed = 1234;
  torch::manual_seed(99);
  auto a = generate(model, prompts, cfg);
  auto global_after = torch::rand({4});
  torch::manual_seed(99);
  auto b = generate(model, prompts, cfg);
  EXPECT_TRUE(torch::equal(a.responses, b.responses));
  EXPECT_TRUE(torch::equal(a.log_probs, b.log_probs));
  // The local generator leaves the global RNG stream alone.
  torch::manual_seed(99);
  EXPECT_TRUE(torch::equal(global_after, torch::rand({4})));
  cfg.seed = 4321;
  auto c = generate(model, prompts, cfg);
  EXPECT_FALSE(torch::equal(a.responses, c.responses));
}

TEST_F(GenerationTest, TopKOneEqualsGreedy) {
  GenerationConfig greedy;
  greedy.greedy = true;
  greedy.max_new_tokens = 6;
  GenerationConfig top1 = greedy;
  top1.greedy = false;
  top1.top_k = 1;
  top1.temperature = 0.8;
  top1.seed = 5;
  EXPECT_TRUE(torch::equal(generate(model, prompts, greedy).responses, generate(model, prompts, top1).responses));
  // A tiny nucleus keeps only the most likely token as well.
  GenerationConfig nucleus = top1;
  nucleus.top_k = 0;
  nucleus.top_p = 1e-6;
  EXPECT_TRUE(torch::equal(generate(model, prompts, greedy).responses, generate(model, prompts, nucleus).responses));
}

TEST_F(GenerationTest, LogProbsMatchFullForward) {
  for (bool greedy : {false, true}) {
    GenerationConfig cfg;
    cfg.max_new_tokens = 7;
    cfg.greedy = greedy;
    cfg.temperature = 0.7;
    cfg.top_k = 10;
    cfg.top_p = 0.9;  // filters restrict the draw but not the reported log-probs
    cfg.seed = 3;
    cfg.n = 2;
    auto out = generate(model, prompts, cfg);
    auto expected = recomputed_log_probs(model, out, greedy ? 1.0 : cfg.temperature);
    EXPECT_TRUE(torch::allclose(out.log_probs, expected, 1e-4, 1e-4))
        << "greedy=" << greedy << " max diff " << (out.log_probs - expected).abs().max().item<float>();
    EXPECT_TRUE((out.log_probs <= 0).all().item<bool>());
  }
}

TEST_F(GenerationTest, EosStopsSequenceAndPadsAfterIt) {
  GenerationConfig cfg;
  cfg.max_new_tokens = 12;
  cfg.temperature = 1.5;
  cfg.seed = 77;
  cfg.pad_token_id = 0;
  auto free_run = generate(model, {prompts[0]}, cfg);
  auto tokens = row(free_run.responses, 0);
  const int64_t eos = tokens[4];
  const int64_t stop = std::find(tokens.begin(), tokens.end(), eos) - tokens.begin();
  cfg.eos_token_ids = {eos};
  auto stopped = generate(model, {prompts[0]}, cfg);
  // Alone, the loop ends at eos, which is kept.
  ASSERT_EQ(stopped.responses.size(1), stop + 1);
  EXPECT_EQ(row(stopped.responses, 0), std::vector<int64_t>(tokens.begin(), tokens.begin() + stop + 1));
  EXPECT_EQ(stopped.response_mask.sum().item<int64_t>(), stop + 1);

  // In a batch, finished rows are padded to the longest response and masked out.
  cfg.n = 3;
  auto out = generate(model, prompts, cfg);
  const int64_t r = out.responses.size(1);
  ASSERT_EQ(out.responses.size(0), 9);
  bool some_row_stopped = false;
  bool all_stopped = true;
  int64_t longest = 0;
  for (int64_t i = 0; i < 9; ++i) {
    auto resp = row(out.responses, i);
    auto mask = row(out.response_mask, i);
    int64_t len = 0;
    while (len < r && mask[len] == 1) ++len;
    ASSERT_GE(len, 1);
    for (int64_t t = len; t < r; ++t) {
      EXPECT_EQ(mask[t], 0) << "mask is not a prefix, row " << i;
      EXPECT_EQ(resp[t], cfg.pad_token_id) << "row " << i;
      EXPECT_EQ(out.log_probs[i][t].item<float>(), 0.0f) << "row " << i;
    }
    for (int64_t t = 0; t + 1 < len; ++t) EXPECT_NE(resp[t], eos) << "generation continued after eos, row " << i;
    const bool ended_with_eos = resp[len - 1] == eos;
    some_row_stopped |= ended_with_eos && len < r;
    all_stopped &= ended_with_eos;
    if (!ended_with_eos) {
      EXPECT_EQ(len, cfg.max_new_tokens) << "row " << i << " stopped without eos";
    }
    longest = std::max(longest, len);
  }
  EXPECT_TRUE(some_row_stopped);
  EXPECT_EQ(r, longest) << "responses must be as wide as the longest response";
  if (!all_stopped) {
    EXPECT_EQ(r, cfg.max_new_tokens);
  }
  auto expected = recomputed_log_probs(model, out, cfg.temperature);
  EXPECT_TRUE(torch::allclose(out.log_probs, expected, 1e-4, 1e-4));
}

// generation_config.json may list several eos ids (Llama 3 instruct: <|end_of_text|>, <|eom_id|>,
// <|eot_id|>): a sequence ends at whichever comes first.
TEST_F(GenerationTest, AnyOfSeveralEosIdsStopsASequence) {
  GenerationConfig cfg;
  cfg.max_new_tokens = 12;
  cfg.temperature = 1.5;
  cfg.seed = 78;
  auto tokens = row(generate(model, {prompts[0]}, cfg).responses, 0);
  // Two ids of the free run that are not its first token: the stop is at the first of either.
  const int64_t a = tokens[6], b = tokens[3];
  const int64_t stop_a = std::find(tokens.begin(), tokens.end(), a) - tokens.begin();
  const int64_t stop_b = std::find(tokens.begin(), tokens.end(), b) - tokens.begin();
  cfg.eos_token_ids = {a, b};
  auto stopped = row(generate(model, {prompts[0]}, cfg).responses, 0);
  EXPECT_EQ(stopped, std::vector<int64_t>(tokens.begin(), tokens.begin() + std::min(stop_a, stop_b) + 1));
  cfg.eos_token_ids = {a};
  EXPECT_EQ(row(generate(model, {prompts[0]}, cfg).responses, 0).size(), static_cast<size_t>(stop_a + 1));
}

// A vocabulary padded past the tokenizer: the padding ids are never drawn, and the returned log-probs are
// those of the distribution actually sampled (normalised over the sampleable ids).
TEST_F(GenerationTest, PaddedVocabularyIdsAreNeverSampled) {
  GenerationConfig cfg;
  cfg.max_new_tokens = 16;
  cfg.temperature = 3.0;  // close to uniform: unmasked, ids past the limit come up often
  cfg.n = 4;
  cfg.seed = 5;
  const int64_t limit = 30;  // of 41
  auto free_run = generate(model, prompts, cfg);
  EXPECT_TRUE(free_run.responses.ge(limit).any().item<bool>()) << "the check below would be vacuous";
  cfg.sampleable_vocab_size = limit;
  auto out = generate(model, prompts, cfg);
  EXPECT_FALSE(out.responses.masked_select(out.response_mask.to(torch::kBool)).ge(limit).any().item<bool>());
  // Against log-softmax over the first `limit` logits, recomputed with the whole sequence.
  auto ids = torch::cat({out.prompts, out.responses}, 1);
  auto mask = torch::cat({out.prompt_mask, out.response_mask}, 1);
  torch::NoGradGuard no_grad;
  model->eval();
  auto logits = model->forward(ids, mask).logits.slice(-1, 0, limit) / cfg.temperature;
  const int64_t p = out.prompts.size(1), r = out.responses.size(1);
  auto expected = torch::log_softmax(logits.slice(1, p - 1, p - 1 + r), -1)
                      .gather(-1, out.responses.clamp_max(limit - 1).unsqueeze(-1))
                      .squeeze(-1) *
                  out.response_mask;
  EXPECT_TRUE(torch::allclose(out.log_probs, expected, 1e-4, 1e-4));
  cfg.sampleable_vocab_size = 42;
  EXPECT_THROW(generate(model, prompts, cfg), Error);
}

TEST_F(GenerationTest, KvCacheAndRecomputeAgree) {
  GenerationConfig cfg;
  cfg.greedy = true;
  cfg.max_new_tokens = 8;
  auto cached = generate(model, prompts, cfg);
  cfg.use_kv_cache = false;
  auto recomputed = generate(model, prompts, cfg);
  EXPECT_TRUE(torch::equal(cached.responses, recomputed.responses));
  EXPECT_TRUE(torch::allclose(cached.log_probs, recomputed.log_probs, 1e-4, 1e-4));
}

// Each prompt repeated n times, in the output's row order (row i*n+j = sample j of prompt i).
std::vector<std::vector<int64_t>> repeated(const std::vector<std::vector<int64_t>>& prompts, int64_t n) {
  std::vector<std::vector<int64_t>> out;
  for (const auto& p : prompts)
    for (int64_t j = 0; j < n; ++j) out.push_back(p);
  return out;
}

// n > 1 prefills each prompt once and copies its cache to the n rows: the result must equal prefilling
// every row, i.e. the prompts repeated n times with n = 1 (greedy and, with one seed, sampling).
TEST_F(GenerationTest, SharedPrefillEqualsRepeatedPrompts) {
  for (bool greedy : {true, false}) {
    GenerationConfig cfg;
    cfg.greedy = greedy;
    cfg.temperature = 0.8;
    cfg.max_new_tokens = 9;
    cfg.seed = 5;
    cfg.n = 3;
    auto shared = generate(model, prompts, cfg);
    cfg.n = 1;
    auto each = generate(model, repeated(prompts, 3), cfg);
    EXPECT_TRUE(torch::equal(shared.prompts, each.prompts));
    EXPECT_TRUE(torch::equal(shared.responses, each.responses)) << "greedy=" << greedy;
    EXPECT_TRUE(torch::equal(shared.response_mask, each.response_mask));
    EXPECT_TRUE(torch::allclose(shared.log_probs, each.log_probs, 1e-5, 1e-5))
        << "greedy=" << greedy << " max diff " << (shared.log_probs - each.log_probs).abs().max().item<float>();
  }
}

// The cache (preallocated slab, shared prefill, rows leaving at eos) against recomputing the whole
// sequence every step, which uses none of it: sampled with one seed, the draws must match.
TEST_F(GenerationTest, CachedSamplingWithEosEqualsRecompute) {
  GenerationConfig cfg;
  cfg.max_new_tokens = 12;
  cfg.temperature = 1.3;
  cfg.seed = 21;
  cfg.n = 3;
  auto probe = generate(model, prompts, cfg);
  cfg.eos_token_ids = {row(probe.responses, 0)[3], row(probe.responses, 4)[2]};
  auto cached = generate(model, prompts, cfg);
  cfg.use_kv_cache = false;
  auto recomputed = generate(model, prompts, cfg);
  ASSERT_EQ(cached.responses.sizes(), recomputed.responses.sizes());
  EXPECT_TRUE(torch::equal(cached.responses, recomputed.responses));
  EXPECT_TRUE(torch::equal(cached.response_mask, recomputed.response_mask));
  EXPECT_LT(cached.response_mask.sum().item<int64_t>(), cached.response_mask.numel()) << "no row stopped early";
  EXPECT_TRUE(torch::allclose(cached.log_probs, recomputed.log_probs, 1e-4, 1e-4));
}

// Grouped-query attention folds the query heads that share a KV head instead of copying K/V per head;
// one KV head (MQA), a group of 2 (the fixture) and none (kv_heads = heads) must decode as recomputation.
TEST_F(GenerationTest, GroupedQueryAttentionCachedEqualsRecompute) {
  for (int64_t kv_heads : {1, 2, 4}) {
    ModelConfig c = test_config();
    c.num_key_value_heads = kv_heads;
    torch::manual_seed(3);
    CausalLM gqa(c);
    {
      torch::NoGradGuard no_grad;
      for (auto& p : gqa->parameters())
        if (p.dim() == 2) p.mul_(10.0);
    }
    GenerationConfig cfg;
    cfg.greedy = true;
    cfg.max_new_tokens = 8;
    cfg.n = 2;
    auto cached = generate(gqa, prompts, cfg);
    cfg.use_kv_cache = false;
    auto recomputed = generate(gqa, prompts, cfg);
    EXPECT_TRUE(torch::equal(cached.responses, recomputed.responses)) << "kv_heads " << kv_heads;
    EXPECT_TRUE(torch::allclose(cached.log_probs, recomputed.log_probs, 1e-4, 1e-4)) << "kv_heads " << kv_heads;
  }
}

// Rows that reach eos leave the batch (their cache rows are dropped); the others must go on exactly as if
// nobody had stopped: each row equals the run without eos up to and including its first eos.
TEST_F(GenerationTest, EarlyExitLeavesOtherRowsUnchanged) {
  GenerationConfig cfg;
  cfg.greedy = true;
  cfg.max_new_tokens = 10;
  cfg.n = 2;
  auto free_run = generate(model, prompts, cfg);
  const int64_t eos = row(free_run.responses, 2)[2];
  cfg.eos_token_ids = {eos};
  auto stopped = generate(model, prompts, cfg);
  int64_t early = 0;
  for (int64_t i = 0; i < free_run.responses.size(0); ++i) {
    auto full = row(free_run.responses, i);
    const int64_t len = std::find(full.begin(), full.end(), eos) - full.begin();
    const int64_t kept = std::min<int64_t>(len + 1, cfg.max_new_tokens);
    early += kept < cfg.max_new_tokens;
    ASSERT_EQ(stopped.response_mask[i].sum().item<int64_t>(), kept) << "row " << i;
    auto got = row(stopped.responses, i);
    EXPECT_EQ(std::vector<int64_t>(got.begin(), got.begin() + kept), std::vector<int64_t>(full.begin(), full.begin() + kept))
        << "row " << i;
    EXPECT_TRUE(torch::allclose(stopped.log_probs[i].slice(0, 0, kept), free_run.log_probs[i].slice(0, 0, kept), 1e-5, 1e-5))
        << "row " << i;
  }
  EXPECT_GT(early, 0);
  EXPECT_LT(early, free_run.responses.size(0));
}

// Continuous batching against the static batch (left-padded, rows dropping out) and against recomputing
// every sequence from scratch each step, which share none of its slots, per-row positions or admissions:
// greedy and sampled, one and several samples, prompts of different lengths, eos stops, and from one
// slot per prompt's samples (every prompt waits for the one before) to a slot per sequence.
TEST_F(GenerationTest, ContinuousBatchingEqualsStaticBatchAndRecompute) {
  const std::vector<std::vector<int64_t>> ragged = {{5, 9, 2, 30, 7}, {1, 12}, {40, 3, 3}, {8}, {22, 6, 17, 2}};
  for (bool greedy : {true, false}) {
    for (int64_t n : {1, 3}) {
      GenerationConfig cfg;
      cfg.greedy = greedy;
      cfg.temperature = 1.3;
      cfg.top_k = 20;
      cfg.max_new_tokens = 10;
      cfg.seed = 17;
      cfg.n = n;
      auto probe = generate(model, ragged, cfg);
      // Two ids the free run draws early, so that several rows stop at different steps.
      cfg.eos_token_ids = {row(probe.responses, 0)[2], row(probe.responses, n)[1]};
      cfg.continuous_batching = false;
      auto fixed = generate(model, ragged, cfg);
      cfg.use_kv_cache = false;
      auto recomputed = generate(model, ragged, cfg);
      EXPECT_TRUE(torch::equal(fixed.responses, recomputed.responses));
      ASSERT_LT(fixed.response_mask.sum().item<int64_t>(), fixed.response_mask.numel()) << "no row stopped early";
      cfg.use_kv_cache = true;
      cfg.continuous_batching = true;
      for (int64_t slots : {int64_t{0}, n, 2 * n + 1, int64_t{4}}) {
        cfg.max_num_seqs = slots;
        auto got = generate(model, ragged, cfg);
        const std::string what = "greedy=" + std::to_string(greedy) + " n=" + std::to_string(n) +
                                 " max_num_seqs=" + std::to_string(slots);
        EXPECT_TRUE(torch::equal(got.prompts, fixed.prompts)) << what;
        EXPECT_TRUE(torch::equal(got.prompt_mask, fixed.prompt_mask)) << what;
        ASSERT_EQ(got.responses.sizes(), fixed.responses.sizes()) << what;
        EXPECT_TRUE(torch::equal(got.responses, fixed.responses)) << what;
        EXPECT_TRUE(torch::equal(got.response_mask, fixed.response_mask)) << what;
        EXPECT_TRUE(torch::allclose(got.log_probs, fixed.log_probs, 1e-4, 1e-4))
            << what << " max diff " << (got.log_probs - fixed.log_probs).abs().max().item<float>();
        EXPECT_TRUE(torch::allclose(got.log_probs, recomputed.log_probs, 1e-4, 1e-4)) << what;
      }
    }
  }
}

// With fewer slots than sequences a prompt's answer must not depend on who else was decoding: each row
// equals the prompt generated alone (greedy, and sampled: draws belong to the sequence, not the batch).
TEST_F(GenerationTest, FewSlotsEqualOnePromptAtATime) {
  const std::vector<std::vector<int64_t>> ragged = {{5, 9, 2, 30, 7}, {1, 12}, {40, 3, 3}, {8}};
  for (bool greedy : {true, false}) {
    GenerationConfig cfg;
    cfg.greedy = greedy;
    cfg.temperature = 0.9;
    cfg.max_new_tokens = 9;
    cfg.n = 2;
    cfg.seed = 3;
    cfg.max_num_seqs = 5;  // two prompts' samples and a spare: admissions interleave with running rows
    auto batch = generate(model, ragged, cfg);
    for (size_t i = 0; i < ragged.size(); ++i) {
      // Alone, prompt i's samples are sequences 0 and 1: give them prompt i's sequence numbers' draws by
      // running the prompts before it too, with one slot pair (the answers of those are not compared).
      std::vector<std::vector<int64_t>> upto(ragged.begin(), ragged.begin() + static_cast<std::ptrdiff_t>(i) + 1);
      cfg.max_num_seqs = 2;
      auto alone = generate(model, upto, cfg);
      for (int64_t j = 0; j < 2; ++j) {
        const int64_t q = static_cast<int64_t>(i) * 2 + j;
        auto a = row(alone.responses, q), b = row(batch.responses, q);
        const int64_t len = batch.response_mask[q].sum().item<int64_t>();
        ASSERT_EQ(alone.response_mask[q].sum().item<int64_t>(), len) << "greedy=" << greedy << " row " << q;
        EXPECT_EQ(std::vector<int64_t>(a.begin(), a.begin() + len), std::vector<int64_t>(b.begin(), b.begin() + len))
            << "greedy=" << greedy << " row " << q;
      }
      if (greedy) {
        // Greedy needs no draws: the prompt alone, as sequence 0.
        GenerationConfig one = cfg;
        one.n = 1;
        auto single = generate(model, {ragged[i]}, one);
        const int64_t q = static_cast<int64_t>(i) * 2;
        const int64_t len = batch.response_mask[q].sum().item<int64_t>();
        auto a = row(single.responses, 0), b = row(batch.responses, q);
        EXPECT_EQ(std::vector<int64_t>(a.begin(), a.begin() + len), std::vector<int64_t>(b.begin(), b.begin() + len));
        EXPECT_TRUE(
            torch::allclose(single.log_probs[0].slice(0, 0, len), batch.log_probs[q].slice(0, 0, len), 1e-4, 1e-4));
      }
      cfg.max_num_seqs = 5;
    }
  }
}

// admission_rows groups the joins: with 8 slots and prompts of 2 samples, prompts join while rows decode only
// when 6 places are free (or the last prompts fit), so fewer prefills run, and every answer is the one a join
// as soon as 2 places free up gives (the draws belong to the sequence). -1 is a quarter of the slots (2 here,
// one prompt: the same joins as 0); a threshold past the slots still admits once nothing runs.
TEST_F(GenerationTest, AdmissionRowsGroupJoinsAndKeepEveryAnswer) {
  std::vector<std::vector<int64_t>> prompts;
  for (int64_t i = 0; i < 12; ++i) prompts.push_back({1 + (i * 7) % 40, 2 + i % 5, 3 + (i * 3) % 11});
  for (bool greedy : {false, true}) {
    GenerationConfig cfg;
    cfg.greedy = greedy;
    cfg.temperature = 0.9;
    cfg.max_new_tokens = 12;
    cfg.n = 2;
    cfg.seed = 5;
    cfg.max_num_seqs = 8;
    cfg.eos_token_ids = {3, 7, 11, 19, 23};  // rows end at different steps
    const std::string what = greedy ? "greedy" : "sampled";
    cfg.admission_rows = 0;
    const auto eager = generate(model, prompts, cfg);
    cfg.admission_rows = -1;
    const auto quarter = generate(model, prompts, cfg);
    EXPECT_EQ(quarter.prefills, eager.prefills) << what;
    for (int64_t rows : {int64_t{6}, int64_t{100}}) {
      cfg.admission_rows = rows;
      const auto grouped = generate(model, prompts, cfg);
      const std::string how = what + " admission_rows " + std::to_string(rows);
      EXPECT_TRUE(torch::equal(grouped.responses, eager.responses)) << how;
      EXPECT_TRUE(torch::equal(grouped.response_mask, eager.response_mask)) << how;
      EXPECT_TRUE(torch::allclose(grouped.log_probs, eager.log_probs, 1e-4, 1e-4)) << how;
      EXPECT_LT(grouped.prefills, eager.prefills) << how;
      EXPECT_GE(grouped.decode_steps, eager.decode_steps) << how;
    }
    EXPECT_GT(eager.prefills, 4) << what << ": the case should admit prompts one at a time without grouping";
  }
  GenerationConfig bad;
  bad.admission_rows = -2;
  try {
    generate(model, prompts, bad);
    ADD_FAILURE() << "admission_rows -2 accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("admission_rows"), std::string::npos) << e.what();
  }
}

// max_num_batched_tokens bounds an admission's forward: prompts of 5, 2 and 3 ids under a budget of 10 positions
// join as 5 + 2 (2 rows x 5) and then 3, a budget below the longest prompt still admits one at a time; the
// answers are those of one forward for all (log-probs to rounding, bit for bit under the batch-invariant kernels).
TEST_F(GenerationTest, AdmissionsStayWithinMaxNumBatchedTokens) {
  for (const bool exact : {true, false}) {
    BatchInvariantGuard kernels(exact);
    GenerationConfig cfg;
    cfg.temperature = 1.0;
    cfg.max_new_tokens = 6;
    cfg.n = 2;
    cfg.seed = 9;
    cfg.kv_block_size = 4;
    const auto together = generate(model, prompts, cfg);
    EXPECT_EQ(together.prefills, 1);
    for (const auto& [budget, prefills] : {std::pair<int64_t, int64_t>{10, 2}, {1, 3}}) {
      cfg.max_num_batched_tokens = budget;
      const auto split = generate(model, prompts, cfg);
      const std::string what = std::string(exact ? "batch-invariant" : "default") + ", budget " + std::to_string(budget);
      EXPECT_EQ(split.prefills, prefills) << what;
      EXPECT_TRUE(torch::equal(split.responses, together.responses)) << what;
      if (exact)
        EXPECT_TRUE(torch::equal(split.log_probs, together.log_probs)) << what;
      else
        EXPECT_TRUE(torch::allclose(split.log_probs, together.log_probs, 1e-5, 1e-5)) << what;
    }
  }
  GenerationConfig bad;
  bad.max_num_batched_tokens = 0;
  try {
    generate(model, prompts, bad);
    ADD_FAILURE() << "max_num_batched_tokens 0 accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("max_num_batched_tokens"), std::string::npos) << e.what();
  }
}

// Sampling draws token t of sequence q with sampling_uniform(seed, q, t) by inverse transform: the chosen
// id is where that number falls in the cumulative distribution, computed here independently in float64.
TEST(SampleNextTokens, InverseTransformOfEachRowsOwnUniform) {
  torch::manual_seed(4);
  GenerationConfig cfg;
  cfg.temperature = 0.7;
  auto logits = torch::randn({5, 37}) * 3;
  std::vector<double> uniforms = {0.0, 0.25, 0.5, 0.999, 0.731};
  auto [tokens, log_probs] = sample_next_tokens(logits, cfg, uniforms);
  auto cdf = torch::softmax(logits / cfg.temperature, -1).to(torch::kFloat64).cumsum(-1);
  for (int64_t r = 0; r < 5; ++r) {
    const int64_t expected =
        (cdf[r] <= uniforms[static_cast<size_t>(r)] * cdf[r][-1].item<double>()).sum().item<int64_t>();
    EXPECT_EQ(tokens[r].item<int64_t>(), expected) << "row " << r;
    EXPECT_NEAR(log_probs[r].item<float>(),
                torch::log_softmax(logits[r] / cfg.temperature, -1)[expected].item<float>(), 1e-6);
  }
  // The draws are a function of (seed, sequence, step) alone, in [0, 1), and not constant.
  EXPECT_EQ(sampling_uniform(7, 3, 2), sampling_uniform(7, 3, 2));
  EXPECT_NE(sampling_uniform(7, 3, 2), sampling_uniform(7, 3, 3));
  EXPECT_NE(sampling_uniform(7, 3, 2), sampling_uniform(7, 4, 2));
  EXPECT_NE(sampling_uniform(7, 3, 2), sampling_uniform(8, 3, 2));
  double mean = 0;
  for (int64_t i = 0; i < 4000; ++i) {
    const double u = sampling_uniform(1, i % 40, i / 40);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    mean += u / 4000;
  }
  EXPECT_NEAR(mean, 0.5, 0.02);
  // A row filtered to one token (top_k 1) takes it whatever the uniform.
  cfg.top_k = 1;
  auto [top, unused] = sample_next_tokens(logits, cfg, {0.999, 0.999, 0.999, 0.999, 0.999});
  EXPECT_TRUE(torch::equal(top, logits.argmax(-1)));
}

TEST_F(GenerationTest, SamplesPerPromptLayout) {
  GenerationConfig cfg;
  cfg.n = 4;
  cfg.max_new_tokens = 6;
  cfg.temperature = 2.0;
  cfg.seed = 9;
  auto out = generate(model, prompts, cfg);
  ASSERT_EQ(out.prompts.sizes(), (std::vector<int64_t>{12, 5}));
  ASSERT_EQ(out.responses.sizes(), (std::vector<int64_t>{12, 6}));
  EXPECT_EQ(out.responses.scalar_type(), torch::kInt64);
  EXPECT_EQ(out.log_probs.scalar_type(), torch::kFloat32);
  for (int64_t i = 0; i < 3; ++i) {
    const auto& p = prompts[i];
    for (int64_t j = 0; j < 4; ++j) {
      auto ids = row(out.prompts, i * 4 + j);
      EXPECT_EQ(std::vector<int64_t>(ids.end() - p.size(), ids.end()), p) << "row " << i * 4 + j;
      EXPECT_EQ(out.prompt_mask[i * 4 + j].sum().item<int64_t>(), static_cast<int64_t>(p.size()));
    }
    // Samples of one prompt are drawn independently, so at high temperature they differ.
    auto samples = out.responses.slice(0, i * 4, i * 4 + 4);
    EXPECT_FALSE(torch::equal(samples[0], samples[1]) && torch::equal(samples[1], samples[2]) &&
                 torch::equal(samples[2], samples[3]))
        << "prompt " << i;
  }
}

TEST_F(GenerationTest, RestoresTrainingModeAndLeavesNoGradient) {
  GenerationConfig cfg;
  cfg.max_new_tokens = 3;
  model->train();
  auto out = generate(model, prompts, cfg);
  EXPECT_TRUE(model->is_training());
  EXPECT_FALSE(out.log_probs.requires_grad());
  model->eval();
  generate(model, prompts, cfg);
  EXPECT_FALSE(model->is_training());
}

// The paged KV cache against the slabs: prompts of different lengths (some in one block, some across
// several, some ending on a block's edge), n samples sharing each prompt's blocks, stop tokens ending rows
// at different steps. With a pool that holds everything the two paths admit the same prompts at the same
// steps and run the same arithmetic: tokens and log-probs are equal bit for bit.
TEST_F(GenerationTest, PagedCacheEqualsSlotsBitForBit) {
  const std::vector<std::vector<int64_t>> ragged = {
      {5, 9, 2, 30, 7}, {1, 12}, {40, 3, 3, 8}, {8}, {22, 6, 17, 2, 9, 11, 4, 4, 31}};
  for (bool greedy : {true, false}) {
    for (int64_t n : {1, 3}) {
      GenerationConfig cfg;
      cfg.greedy = greedy;
      cfg.temperature = 1.1;
      cfg.max_new_tokens = 11;
      cfg.seed = 5;
      cfg.n = n;
      cfg.paged_kv_cache = false;
      auto probe = generate(model, ragged, cfg);
      cfg.eos_token_ids = {row(probe.responses, 0)[3], row(probe.responses, n)[1]};
      for (int64_t slots : {int64_t{0}, 2 * n + 1}) {
        cfg.max_num_seqs = slots;
        cfg.paged_kv_cache = false;
        auto slabs = generate(model, ragged, cfg);
        ASSERT_LT(slabs.response_mask.sum().item<int64_t>(), slabs.response_mask.numel()) << "no row stopped early";
        for (int64_t block_size : {1, 2, 4, 16}) {
          cfg.paged_kv_cache = true;
          cfg.kv_block_size = block_size;
          auto paged = generate(model, ragged, cfg);
          const std::string what = "greedy=" + std::to_string(greedy) + " n=" + std::to_string(n) +
                                   " max_num_seqs=" + std::to_string(slots) + " block_size=" + std::to_string(block_size);
          EXPECT_TRUE(torch::equal(paged.responses, slabs.responses)) << what;
          EXPECT_TRUE(torch::equal(paged.response_mask, slabs.response_mask)) << what;
          EXPECT_TRUE(torch::equal(paged.log_probs, slabs.log_probs))
              << what << " max diff " << (paged.log_probs - slabs.log_probs).abs().max().item<float>();
          EXPECT_GT(paged.kv_cache.peak_blocks, 0) << what;
          EXPECT_LE(paged.kv_cache.peak_blocks, paged.kv_cache.pool_blocks) << what;
        }
      }
    }
  }
}

// A pool too small for every sequence at once: prompts wait for blocks that finished sequences free, and
// the answers are still those of the slabs (tokens exactly; log-probs up to the prefill's batch, which
// differs when admissions differ).
TEST_F(GenerationTest, SmallPagedPoolMakesPromptsWaitWithTheSameAnswers) {
  const std::vector<std::vector<int64_t>> ragged = {{5, 9, 2, 30, 7}, {1, 12}, {40, 3, 3}, {8}, {22, 6, 17, 2}, {3, 3}};
  for (bool greedy : {true, false}) {
    GenerationConfig cfg;
    cfg.greedy = greedy;
    cfg.temperature = 0.8;
    cfg.max_new_tokens = 9;
    cfg.seed = 21;
    cfg.n = 2;
    cfg.paged_kv_cache = false;
    auto probe = generate(model, ragged, cfg);
    cfg.eos_token_ids = {row(probe.responses, 2)[2]};
    auto slabs = generate(model, ragged, cfg);
    cfg.paged_kv_cache = true;
    cfg.kv_block_size = 4;
    auto ample = generate(model, ragged, cfg);
    // The longest prompt's samples alone: 2 prompt blocks + 2 x (4 - 2 + 1) = 8; twice that is far below
    // what all six prompts may hold at once.
    cfg.kv_cache_blocks = 10;
    auto small = generate(model, ragged, cfg);
    EXPECT_GT(ample.kv_cache.peak_blocks, 10) << "the ample pool never needed more than the small one";
    EXPECT_LE(small.kv_cache.peak_blocks, 10);
    EXPECT_EQ(small.kv_cache.pool_blocks, 10);
    EXPECT_EQ(small.kv_cache.sequences_fit, 10 / 4);  // 5 + 9 - 1 = 13 positions: 4 blocks each
    EXPECT_TRUE(torch::equal(small.responses, slabs.responses)) << "greedy=" << greedy;
    EXPECT_TRUE(torch::equal(small.response_mask, slabs.response_mask)) << "greedy=" << greedy;
    EXPECT_TRUE(torch::allclose(small.log_probs, slabs.log_probs, 1e-5, 1e-5))
        << "greedy=" << greedy << " max diff " << (small.log_probs - slabs.log_probs).abs().max().item<float>();
  }
  GenerationConfig cfg;
  cfg.max_new_tokens = 9;
  cfg.n = 2;
  cfg.kv_block_size = 4;
  cfg.kv_cache_blocks = 7;  // one short of the longest prompt's 8
  try {
    generate(model, ragged, cfg);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs 8 KV blocks of 4 positions; the pool has 7"), std::string::npos)
        << e.what();
  }
}

// The pool from a memory budget (verl's gpu_memory_utilization): the fraction of the budget less the
// weights, in blocks spanning every layer; the run reports the pool and how many sequences fit.
TEST_F(GenerationTest, PagedPoolFromAMemoryFraction) {
  int64_t weight_bytes = 0;
  for (const auto& p : model->parameters()) weight_bytes += p.numel() * static_cast<int64_t>(p.element_size());
  const int64_t block_bytes = 2 * 2 * 2 * 4 * 8 * 4;  // layers x keys, values x KV heads x 4 positions x 8 x fp32
  GenerationConfig cfg;
  cfg.max_new_tokens = 6;
  cfg.n = 2;
  cfg.kv_block_size = 4;
  cfg.gpu_memory_utilization = 0.5;
  cfg.memory_budget_bytes = 2 * (weight_bytes + 12 * block_bytes + block_bytes / 2);
  auto out = generate(model, prompts, cfg);
  EXPECT_EQ(out.kv_cache.pool_blocks, 12);
  EXPECT_EQ(out.kv_cache.block_bytes, block_bytes);
  EXPECT_EQ(out.kv_cache.sequences_fit, 12 / 3);  // the longest prompt (5) + 6 - 1 positions: 3 blocks
  EXPECT_LE(out.kv_cache.peak_blocks, 12);
  cfg.gpu_memory_utilization = 0.25;  // less than the weights
  try {
    generate(model, prompts, cfg);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gpu_memory_utilization 0.25"), std::string::npos) << e.what();
  }
}

// Shared prompts are stored once: n samples of long prompts hold far fewer bytes than the slabs.
TEST_F(GenerationTest, PagedCacheStoresEachPromptOnce) {
  std::vector<std::vector<int64_t>> long_prompts;
  for (int64_t i = 0; i < 3; ++i) {
    std::vector<int64_t> p;
    for (int64_t t = 0; t < 30; ++t) p.push_back(1 + (t * 7 + i * 5) % 39);
    long_prompts.push_back(p);
  }
  GenerationConfig cfg;
  cfg.max_new_tokens = 4;
  cfg.n = 4;
  cfg.greedy = true;
  cfg.kv_block_size = 4;
  cfg.paged_kv_cache = false;
  auto slabs = generate(model, long_prompts, cfg);
  cfg.paged_kv_cache = true;
  auto paged = generate(model, long_prompts, cfg);
  EXPECT_TRUE(torch::equal(paged.responses, slabs.responses));
  EXPECT_TRUE(torch::equal(paged.log_probs, slabs.log_probs));
  // Per prompt, all running at once: its 30 positions in 8 blocks, once; three samples copy the last one
  // (positions 28-29) to write 30 and 31 there, the fourth writes in place; each takes a block for 32.
  EXPECT_EQ(paged.kv_cache.peak_blocks, 3 * (8 + 3 + 4));
  // 2 layers x keys and values x 2 KV heads x 4 positions x head_dim 8 x 4 bytes.
  EXPECT_EQ(paged.kv_cache.block_bytes, 2 * 2 * 2 * 4 * 8 * 4);
  // The slabs: 12 slots x (30 + 4) positions.
  EXPECT_EQ(slabs.kv_cache.peak_bytes, 12 * 34 * (2 * 2 * 2 * 8 * 4));
  EXPECT_LT(paged.kv_cache.peak_bytes * 2, slabs.kv_cache.peak_bytes);
}

// Off the fused CPU kernels (here float64; tensor parallelism and the GPU take the same path) the paged
// step gathers each row's blocks: the same answers as the slabs.
TEST_F(GenerationTest, PagedCacheOnTheGatherPathEqualsSlots) {
  model->to(torch::kFloat64);
  GenerationConfig cfg;
  cfg.max_new_tokens = 7;
  cfg.n = 2;
  cfg.seed = 4;
  cfg.kv_block_size = 2;
  cfg.paged_kv_cache = false;
  auto slabs = generate(model, prompts, cfg);
  cfg.paged_kv_cache = true;
  auto paged = generate(model, prompts, cfg);
  EXPECT_TRUE(torch::equal(paged.responses, slabs.responses));
  EXPECT_TRUE(torch::allclose(paged.log_probs, slabs.log_probs, 1e-6, 1e-6))
      << (paged.log_probs - slabs.log_probs).abs().max().item<float>();
  EXPECT_GT(paged.kv_cache.peak_blocks, 0);
}

// CUDA graphs asked for on the CPU (verl configs set rollout.enforce_eager: false): the steps run eagerly,
// with the eager tokens and log-probs bit for bit and no graph; the graph runner itself refuses a CPU model,
// naming the key.
TEST_F(GenerationTest, CudaGraphsOnTheCpuDecodeEagerly) {
  GenerationConfig cfg;
  cfg.max_new_tokens = 6;
  cfg.n = 2;
  cfg.seed = 8;
  cfg.kv_block_size = 2;
  auto eager = generate(model, prompts, cfg);
  cfg.cuda_graphs = true;
  auto asked = generate(model, prompts, cfg);
  EXPECT_TRUE(torch::equal(asked.responses, eager.responses));
  EXPECT_TRUE(torch::equal(asked.log_probs, eager.log_probs));
  EXPECT_EQ(asked.decode_graphs, 0);
  EXPECT_EQ(asked.graph_steps, 0);
  PagedKVCache cache;
  cache.keys.push_back(torch::zeros({4, 1, 2, 8}));
  cache.values.push_back(torch::zeros({4, 1, 2, 8}));
  try {
    DecodeGraphs graphs(model, cache, {.block_size = 2, .max_rows = 8, .max_span = 16}, 3, 0);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("enforce_eager"), std::string::npos) << e.what();
  }
}

// The fused decode kernels' CPU references (kernels::Mode::kEverywhere: the CUDA decode path's arithmetic) in
// bf16 choose the gather path's greedy tokens over 40 steps, with log-probs within bf16 rounding. The model is
// test_cuda_parity's, unscaled: with its weights scaled by 8 (as that test does for fp32, to spread the logits)
// bf16 rounding alone flips greedy choices (the gather path leaves the fp32 tokens at step 5 of one row), and
// the references and the CUDA kernels then diverge from the gather path at the same step, with the same
// log-prob difference (1.374, measured on an H200, 2026-11-28).
TEST(FusedDecodeReferences, ChooseTheGatherPathsTokensInBf16) {
  torch::manual_seed(5);
  CausalLM m(testing::paged_case_model_config());
  m->to(torch::kBFloat16);
  const GenerationConfig cfg = testing::paged_greedy_config();
  const auto prompts = testing::paged_prompts();
  const auto saved = kernels::mode();
  kernels::set_mode(kernels::Mode::kOff);
  auto gathered = generate(m, prompts, cfg);
  kernels::set_mode(kernels::Mode::kEverywhere);
  auto fused = generate(m, prompts, cfg);
  kernels::set_mode(saved);
  EXPECT_EQ(fused.responses.size(1), 40);
  EXPECT_TRUE(torch::equal(fused.responses, gathered.responses));
  const double diff = (fused.log_probs - gathered.log_probs).abs().max().item<double>();
  EXPECT_LT(diff, 5e-2);
  EXPECT_GT(diff, 0.0);  // the two paths round differently: the references did run
}

TEST_F(GenerationTest, RejectsBadInput) {
  GenerationConfig cfg;
  EXPECT_THROW(generate(model, {{1, 2}, {}}, cfg), Error);
  EXPECT_THROW(generate(model, {{1, 99}}, cfg), Error);
  cfg.temperature = 0.0;
  try {
    generate(model, {{1, 2}}, cfg);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("temperature"), std::string::npos) << e.what();
  }
  cfg.temperature = 1.0;
  cfg.max_new_tokens = 0;
  auto empty = generate(model, {{1, 2}}, cfg);
  EXPECT_EQ(empty.responses.sizes(), (std::vector<int64_t>{1, 0}));
}

}  // namespace
}  // namespace hybridflow
