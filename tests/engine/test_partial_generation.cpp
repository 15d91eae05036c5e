// Partial rollouts in the generator (GenerationConfig::refresh_weights): new weights arriving between two
// tokens are taken by the running sequences, whose prefixes are prefilled again, and every token records
// the version that drew it.
#include <gtest/gtest.h>

#include <string>

#include "hybridflow/engine/generation.h"
#include "support/forward_log_probs.h"
#include "support/tiny_model.h"

namespace hybridflow {
namespace {

ModelConfig partial_test_config() {
  return testing::tiny_model_config({.vocab_size = 41, .hidden_size = 32, .intermediate_size = 48}, "qwen2-tiny");
}

// A model with spread logits (larger weights than HF's init), seeded.
CausalLM spread_model(uint64_t seed) {
  torch::manual_seed(seed);
  CausalLM model(partial_test_config());
  torch::NoGradGuard no_grad;
  for (auto& p : model->parameters())
    if (p.dim() == 2) p.mul_(10.0);
  return model;
}

void copy_weights(CausalLM& to, const CausalLM& from) {
  torch::NoGradGuard no_grad;
  auto dst = to->parameters();
  auto src = from->parameters();
  for (size_t i = 0; i < dst.size(); ++i) dst[i].copy_(src[i]);
}

using testing::recomputed_log_probs;

const std::vector<std::vector<int64_t>> kPrompts = {{5, 9, 2, 30, 7}, {1, 12}, {40, 3, 3, 8}, {8}, {22, 6, 17, 2, 9}};

GenerationConfig sampling_config(bool paged, int64_t slots) {
  GenerationConfig cfg;
  cfg.temperature = 1.1;
  cfg.max_new_tokens = 12;
  cfg.seed = 17;
  cfg.n = 2;
  cfg.paged_kv_cache = paged;
  cfg.kv_block_size = 4;
  cfg.max_num_seqs = slots;
  return cfg;
}

// A hook that reports version 1 from its `switch_at`-th call on, first calling `swap` once.
struct VersionSwitch {
  int switch_at = 0;
  std::function<void()> swap;
  int calls = 0;
  int64_t operator()() {
    if (++calls == switch_at && swap) swap();
    return calls >= switch_at ? 1 : 0;
  }
};

// With the same weights behind both versions, the re-prefilled caches continue exactly where the old ones
// were: the same tokens as one version throughout, log-probs within rounding of the prefill's batch, and
// the versions say which tokens came after the switch.
TEST(PartialGeneration, UnchangedWeightsAcrossASwitchGiveTheSameTokens) {
  CausalLM model = spread_model(11);
  for (bool paged : {false, true}) {
    for (int64_t slots : {int64_t{0}, int64_t{4}}) {
      SCOPED_TRACE("paged " + std::to_string(paged) + " max_num_seqs " + std::to_string(slots));
      GenerationConfig cfg = sampling_config(paged, slots);
      const GenerationOutput plain = generate(model, kPrompts, cfg);
      EXPECT_FALSE(plain.token_versions.defined());
      VersionSwitch hook{.switch_at = 5, .swap = {}};
      cfg.refresh_weights = [&hook] { return hook(); };
      const GenerationOutput partial = generate(model, kPrompts, cfg);
      EXPECT_TRUE(torch::equal(partial.responses, plain.responses));
      EXPECT_TRUE(torch::equal(partial.response_mask, plain.response_mask));
      EXPECT_TRUE(torch::allclose(partial.log_probs, plain.log_probs, 1e-4, 1e-5))
          << (partial.log_probs - plain.log_probs).abs().max().item<float>();
      ASSERT_EQ(partial.token_versions.sizes(), partial.responses.sizes());
      const auto mask = partial.response_mask > 0;
      const auto versions = partial.token_versions;
      EXPECT_GT(partial.resumed_sequences, 0);
      // Rounds 1-4 drew with version 0, the later ones with 1; within a row versions never go back.
      EXPECT_TRUE(versions.masked_select(mask).eq(0).any().item<bool>());
      EXPECT_TRUE(versions.masked_select(mask).eq(1).any().item<bool>());
      EXPECT_TRUE((versions.slice(1, 1) >= versions.slice(1, 0, -1)).logical_or(~mask.slice(1, 1)).all().item<bool>());
    }
  }
}

// New weights mid-generation: the tokens drawn before the switch are those of a run on the old weights
// alone (with their log-probs), and every token after it is drawn from the new weights over the whole
// prefix, as a full forward of the new model over prompt + response scores it: the caches were refreshed.
TEST(PartialGeneration, NewWeightsKeepThePrefixAndDrawTheRestFromTheNewModel) {
  for (bool paged : {false, true}) {
    SCOPED_TRACE("paged " + std::to_string(paged));
    CausalLM old_model = spread_model(11);
    CausalLM new_model = spread_model(23);
    CausalLM model = spread_model(11);
    GenerationConfig cfg = sampling_config(paged, 4);
    const GenerationOutput old_only = generate(old_model, kPrompts, cfg);
    VersionSwitch hook{.switch_at = 4, .swap = [&] { copy_weights(model, new_model); }};
    cfg.refresh_weights = [&hook] { return hook(); };
    const GenerationOutput partial = generate(model, kPrompts, cfg);
    ASSERT_EQ(hook.calls > 4, true);
    const auto mask = partial.response_mask > 0;
    const auto before = mask & partial.token_versions.eq(0);
    const auto after = mask & partial.token_versions.eq(1);
    ASSERT_GT(before.sum().item<int64_t>(), 0);
    ASSERT_GT(after.sum().item<int64_t>(), 0);
    EXPECT_GT(partial.resumed_sequences, 0);
    // A row's version-0 tokens are a prefix of the row; the old-only run drew the same ones there.
    const int64_t width = std::min(partial.responses.size(1), old_only.responses.size(1));
    const auto before_w = before.slice(1, 0, width);
    EXPECT_TRUE(torch::equal(partial.responses.slice(1, 0, width).masked_select(before_w),
                             old_only.responses.slice(1, 0, width).masked_select(before_w)));
    EXPECT_TRUE(torch::allclose(partial.log_probs.slice(1, 0, width).masked_select(before_w),
                                old_only.log_probs.slice(1, 0, width).masked_select(before_w), 1e-4, 1e-5));
    // Sampled log-probs per token: the old model's before the switch, the new model's after.
    const auto under_old = recomputed_log_probs(old_model, partial, cfg.temperature);
    const auto under_new = recomputed_log_probs(new_model, partial, cfg.temperature);
    EXPECT_TRUE(torch::allclose(partial.log_probs.masked_select(before), under_old.masked_select(before), 1e-3, 1e-4))
        << (partial.log_probs.masked_select(before) - under_old.masked_select(before)).abs().max().item<float>();
    EXPECT_TRUE(torch::allclose(partial.log_probs.masked_select(after), under_new.masked_select(after), 1e-3, 1e-4))
        << (partial.log_probs.masked_select(after) - under_new.masked_select(after)).abs().max().item<float>();
    // And the two models disagree on those tokens, so the check above could fail.
    EXPECT_GT((under_old.masked_select(after) - under_new.masked_select(after)).abs().max().item<float>(), 1e-2);
  }
}

// The saved state of a stopped generation, as a checkpoint holds it: per sequence its tokens, log-probs,
// versions and whether it ended.
PartialSequences saved_state(const GenerationOutput& out) {
  PartialSequences saved;
  const auto mask = out.response_mask.to(torch::kCPU);
  for (int64_t q = 0; q < out.responses.size(0); ++q) {
    const int64_t length = mask[q].sum().item<int64_t>();
    std::vector<int64_t> tokens, versions;
    std::vector<float> log_probs;
    for (int64_t t = 0; t < length; ++t) {
      tokens.push_back(out.responses[q][t].item<int64_t>());
      log_probs.push_back(out.log_probs[q][t].item<float>());
      versions.push_back(out.token_versions[q][t].item<int64_t>());
    }
    saved.tokens.push_back(tokens);
    saved.log_probs.push_back(log_probs);
    saved.versions.push_back(versions);
    saved.finished.push_back(out.finished[q].item<bool>());
  }
  return saved;
}

// A generation stopped between two tokens (a checkpoint) and continued from its saved state by a new call
// (here or in a resumed process) draws the same tokens as one never stopped: each token's uniform depends
// on (seed, sequence, step) only, and the continued prefixes are prefilled with the same weights. The
// tokens drawn before the stop keep their log-probs bit for bit; later ones are within rounding of the
// prefill's batch. Stopping again at once returns the saved state unchanged.
TEST(PartialGeneration, AStoppedGenerationContinuedFromItsSavedStateDrawsTheSameTokens) {
  CausalLM model = spread_model(11);
  for (bool paged : {false, true}) {
    for (int64_t slots : {int64_t{0}, int64_t{4}}) {
      for (int stop_round : {1, 3, 7}) {
        SCOPED_TRACE("paged " + std::to_string(paged) + " max_num_seqs " + std::to_string(slots) + " stop at round " +
                     std::to_string(stop_round));
        GenerationConfig cfg = sampling_config(paged, slots);
        cfg.refresh_weights = [] { return int64_t{3}; };
        const GenerationOutput whole = generate(model, kPrompts, cfg);
        int rounds = 0;
        cfg.stop_requested = [&rounds, stop_round] { return ++rounds > stop_round; };
        const GenerationOutput stopped = generate(model, kPrompts, cfg);
        ASSERT_TRUE(stopped.stopped);
        const int64_t drawn = stopped.response_mask.sum().item<int64_t>();
        EXPECT_GT(drawn, 0);
        EXPECT_LT(drawn, whole.response_mask.sum().item<int64_t>());
        const auto ended = stopped.finished;
        EXPECT_FALSE(ended.all().item<bool>());
        const PartialSequences saved = saved_state(stopped);

        cfg.resume = &saved;
        cfg.stop_requested = [] { return true; };
        const GenerationOutput again = generate(model, kPrompts, cfg);
        EXPECT_TRUE(again.stopped);
        EXPECT_TRUE(torch::equal(again.responses, stopped.responses));
        EXPECT_TRUE(torch::equal(again.log_probs, stopped.log_probs));
        EXPECT_TRUE(torch::equal(again.finished, stopped.finished));

        cfg.stop_requested = [] { return false; };
        const GenerationOutput continued = generate(model, kPrompts, cfg);
        EXPECT_FALSE(continued.stopped);
        EXPECT_TRUE(continued.finished.all().item<bool>());
        ASSERT_TRUE(torch::equal(continued.responses, whole.responses));
        EXPECT_TRUE(torch::equal(continued.response_mask, whole.response_mask));
        EXPECT_TRUE(torch::allclose(continued.log_probs, whole.log_probs, 1e-4, 1e-5))
            << (continued.log_probs - whole.log_probs).abs().max().item<float>();
        const auto before = stopped.response_mask > 0;
        const int64_t width = stopped.responses.size(1);
        EXPECT_TRUE(torch::equal(continued.log_probs.slice(1, 0, width).masked_select(before),
                                 stopped.log_probs.masked_select(before)));
        EXPECT_TRUE(torch::equal(continued.token_versions, whole.token_versions));
      }
    }
  }
}

// The saved state is checked against the call: another number of sequences or more tokens than the call
// may draw is an error that says so.
TEST(PartialGeneration, ASavedStateOfAnotherShapeIsRefused) {
  CausalLM model = spread_model(11);
  GenerationConfig cfg = sampling_config(true, 4);
  PartialSequences saved;
  saved.tokens.assign(3, {});
  saved.log_probs.assign(3, {});
  saved.finished.assign(3, false);
  cfg.resume = &saved;
  try {
    generate(model, kPrompts, cfg);
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("holds 3 sequences, this call has 10"), std::string::npos) << e.what();
  }
  saved.tokens.assign(10, std::vector<int64_t>(13, 1));
  saved.log_probs.assign(10, std::vector<float>(13, -1.0F));
  saved.finished.assign(10, false);
  try {
    generate(model, kPrompts, cfg);
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("at most max_new_tokens = 12"), std::string::npos) << e.what();
  }
}

TEST(PartialGeneration, NeedsContinuousBatchingOnACache) {
  CausalLM model = spread_model(11);
  GenerationConfig cfg = sampling_config(false, 0);
  cfg.refresh_weights = [] { return int64_t{0}; };
  cfg.continuous_batching = false;
  try {
    generate(model, kPrompts, cfg);
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("partial rollouts"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace hybridflow
