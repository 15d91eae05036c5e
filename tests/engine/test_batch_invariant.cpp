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
#include "hybridflow/engine/model_log_probs.h"
#include "support/tiny_model.h"

namespace hybridflow {
namespace {

constexpr double kTemperature = 0.7;

ModelConfig config_for(const std::string& preset) {
  ModelConfig c = testing::tiny_model_config(
      {.vocab_size = 61, .hidden_size = 64, .intermediate_size = 96, .num_hidden_layers = 2}, preset);
  if (c.sliding_window > 0) c.sliding_window = 5;  // shorter than the sequences, so the window matters
  return c;
}

CausalLM make_model(const std::string& preset) {
  torch::manual_seed(5);
  CausalLM model(config_for(preset));
  torch::NoGradGuard no_grad;
  // Spread logits (HF's 0.02 init gives near-uniform distributions whose log-probs hide rounding).
  for (auto& p : model->parameters())
    if (p.dim() == 2) p.mul_(6.0);
  model->eval();
  return model;
}

const std::vector<std::vector<int64_t>> kPrompts = {
    {5, 9, 2, 30, 7, 11, 4}, {1, 12}, {40, 3, 3, 8, 50, 6, 2, 17, 23, 9, 31}, {7}, {14, 15, 16, 18}};

GenerationConfig sampling(bool continuous, bool paged, int64_t max_num_seqs, int64_t n) {
  GenerationConfig g;
  g.max_new_tokens = 10;
  g.temperature = kTemperature;
  g.top_k = 20;
  g.seed = 3;
  g.n = n;
  g.eos_token_ids = {2};  // responses of different lengths
  g.continuous_batching = continuous;
  g.paged_kv_cache = paged;
  g.kv_block_size = 4;
  g.max_num_seqs = max_num_seqs;
  return g;
}

// One generated sequence: its real prompt and response tokens and the log-probs the rollout recorded.
struct Sample {
  std::vector<int64_t> prompt, response;
  std::vector<float> rollout;
};

std::vector<Sample> samples_of(const GenerationOutput& out) {
  std::vector<Sample> s(static_cast<size_t>(out.prompts.size(0)));
  for (int64_t q = 0; q < out.prompts.size(0); ++q) {
    for (int64_t t = 0; t < out.prompts.size(1); ++t)
      if (out.prompt_mask[q][t].item<int64_t>() != 0) s[q].prompt.push_back(out.prompts[q][t].item<int64_t>());
    for (int64_t t = 0; t < out.responses.size(1); ++t)
      if (out.response_mask[q][t].item<int64_t>() != 0) {
        s[q].response.push_back(out.responses[q][t].item<int64_t>());
        s[q].rollout.push_back(out.log_probs[q][t].item<float>());
      }
  }
  return s;
}

// The actor's recomputation for `rows` of `samples` in one micro-batch: prompts left-padded to the longest plus
// `left_extra`, responses right-padded to the longest plus `right_extra`, one full forward. Returns each row's
// log-probs at its real response tokens.
std::vector<std::vector<float>> recompute(CausalLM& model, const std::vector<Sample>& samples,
                                          const std::vector<size_t>& rows, int64_t left_extra, int64_t right_extra) {
  torch::NoGradGuard no_grad;
  int64_t p = 0, r = 0;
  for (size_t i : rows) {
    p = std::max<int64_t>(p, static_cast<int64_t>(samples[i].prompt.size()));
    r = std::max<int64_t>(r, static_cast<int64_t>(samples[i].response.size()));
  }
  p += left_extra;
  r += right_extra;
  const auto k = static_cast<int64_t>(rows.size());
  auto ids = torch::zeros({k, p + r}, torch::kInt64), mask = torch::zeros({k, p + r}, torch::kInt64);
  for (int64_t j = 0; j < k; ++j) {
    const Sample& s = samples[rows[static_cast<size_t>(j)]];
    const auto plen = static_cast<int64_t>(s.prompt.size());
    for (int64_t t = 0; t < plen; ++t) {
      ids[j][p - plen + t] = s.prompt[static_cast<size_t>(t)];
      mask[j][p - plen + t] = 1;
    }
    for (size_t t = 0; t < s.response.size(); ++t) {
      ids[j][p + static_cast<int64_t>(t)] = s.response[t];
      mask[j][p + static_cast<int64_t>(t)] = 1;
    }
  }
  auto lp = response_log_probs(model, ids, mask, r, kTemperature, /*with_entropy=*/false).log_probs;
  std::vector<std::vector<float>> out;
  for (int64_t j = 0; j < k; ++j) {
    const Sample& s = samples[rows[static_cast<size_t>(j)]];
    std::vector<float> v;
    for (size_t t = 0; t < s.response.size(); ++t) v.push_back(lp[j][static_cast<int64_t>(t)].item<float>());
    out.push_back(v);
  }
  return out;
}

// Every recomputation layout of the samples: alone without padding, in 3s with extra left padding, in 3s
// (another grouping) with extra right padding, all together, and each inside a batch of 64 rows.
std::vector<std::vector<std::vector<float>>> every_layout(CausalLM& model, const std::vector<Sample>& samples) {
  const size_t n = samples.size();
  std::vector<std::vector<std::vector<float>>> layouts;
  auto add = [&](const std::vector<std::vector<size_t>>& groups, int64_t left, int64_t right) {
    std::vector<std::vector<float>> by_row(n);
    for (const auto& g : groups) {
      auto got = recompute(model, samples, g, left, right);
      for (size_t j = 0; j < g.size(); ++j) by_row[g[j]] = got[j];
    }
    layouts.push_back(by_row);
  };
  std::vector<std::vector<size_t>> alone, threes, shifted_threes, all(1), in_64;
  for (size_t i = 0; i < n; ++i) {
    alone.push_back({i});
    all[0].push_back(i);
  }
  for (size_t i = 0; i < n; i += 3) {
    std::vector<size_t> g;
    for (size_t j = i; j < std::min(n, i + 3); ++j) g.push_back(j);
    threes.push_back(g);
  }
  for (size_t i = 0; i < n; ++i) shifted_threes.push_back({i, (i + 1) % n, (i + 2) % n});
  add(alone, 0, 0);
  add(threes, 4, 0);
  add(shifted_threes, 0, 3);
  add(all, 1, 1);
  // Row i at place i % 64 among 63 other rows (the others cycle through the samples).
  for (size_t i = 0; i < n; ++i) {
    std::vector<size_t> g(64);
    for (size_t j = 0; j < 64; ++j) g[j] = (i + n * 64 - i % 64 + j) % n;
    in_64.push_back(g);
  }
  {
    std::vector<std::vector<float>> by_row(n);
    for (size_t i = 0; i < n; ++i) by_row[i] = recompute(model, samples, in_64[i], 2, 2)[i % 64];
    layouts.push_back(by_row);
  }
  return layouts;
}

struct Case {
  std::string preset;
  bool continuous, paged, use_cache;
  int64_t max_num_seqs, n;
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  std::string name = c.preset + (c.use_cache ? (c.continuous ? (c.paged ? "_paged" : "_slots") : "_static") : "_nocache");
  name += "_seqs" + std::to_string(c.max_num_seqs) + "_n" + std::to_string(c.n);
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
}

class BatchInvariantRollout : public ::testing::TestWithParam<Case> {};

TEST_P(BatchInvariantRollout, RecordedLogProbsEqualEveryRecomputationBitForBit) {
  const Case& c = GetParam();
  CausalLM model = make_model(c.preset);
  GenerationConfig g = sampling(c.continuous, c.paged, c.max_num_seqs, c.n);
  g.use_kv_cache = c.use_cache;
  BatchInvariantGuard on;
  const auto samples = samples_of(generate(model, kPrompts, g));
  size_t tokens = 0;
  for (const auto& s : samples) tokens += s.response.size();
  ASSERT_GT(tokens, samples.size() * 2);  // enough decode steps to compare
  const auto layouts = every_layout(model, samples);
  for (size_t layout = 0; layout < layouts.size(); ++layout)
    for (size_t q = 0; q < samples.size(); ++q)
      ASSERT_EQ(layouts[layout][q], samples[q].rollout) << "layout " << layout << ", sequence " << q;
}

INSTANTIATE_TEST_SUITE_P(
    Paths, BatchInvariantRollout,
    ::testing::Values(Case{"tiny", true, true, true, 0, 1}, Case{"tiny", true, true, true, 2, 3},
                      Case{"tiny", true, false, true, 3, 1}, Case{"tiny", true, false, true, 0, 2},
                      Case{"tiny", false, false, true, 0, 2}, Case{"tiny", false, false, false, 0, 1},
                      Case{"qwen2-tiny", true, true, true, 0, 2}, Case{"qwen3-tiny", true, true, true, 4, 2},
                      Case{"mistral-tiny", true, true, true, 0, 2}, Case{"mistral-tiny", false, false, true, 0, 1}),
    case_name);

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

}  // namespace
}  // namespace hybridflow
