// The batch-invariant tests' model, prompts and recomputation layouts, shared by the CPU tests
// (tests/engine/test_batch_invariant.cpp) and the CUDA ones (test_batch_invariant_cuda.cpp): sequences are
// generated with a KV cache in the mode, then scored again by full forwards in every layout (alone, in 3s
// with left or right padding, all together, inside 64 rows), and each layout must give the recorded bits.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "hybridflow/engine/generation.h"
#include "hybridflow/engine/model_log_probs.h"
#include "hybridflow/model/batch_invariant.h"
#include "support/tiny_model.h"

namespace hybridflow::testing::batch_invariant_layouts {

inline constexpr double kTemperature = 0.7;

inline ModelConfig config_for(const std::string& preset) {
  ModelConfig c = testing::tiny_model_config(
      {.vocab_size = 61, .hidden_size = 64, .intermediate_size = 96, .num_hidden_layers = 2}, preset);
  if (c.sliding_window > 0) c.sliding_window = 5;  // shorter than the sequences, so the window matters
  return c;
}

// The same weights on every device (drawn on the CPU, then moved).
inline CausalLM make_model(const std::string& preset, const torch::Device& device = torch::kCPU) {
  torch::manual_seed(5);
  CausalLM model(config_for(preset));
  torch::NoGradGuard no_grad;
  // Spread logits (HF's 0.02 init gives near-uniform distributions whose log-probs hide rounding).
  for (auto& p : model->parameters())
    if (p.dim() == 2) p.mul_(6.0);
  model->to(device);
  model->eval();
  return model;
}

inline const std::vector<std::vector<int64_t>> kPrompts = {
    {5, 9, 2, 30, 7, 11, 4}, {1, 12}, {40, 3, 3, 8, 50, 6, 2, 17, 23, 9, 31}, {7}, {14, 15, 16, 18}};

inline GenerationConfig sampling(bool continuous, bool paged, int64_t max_num_seqs, int64_t n) {
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

inline std::vector<Sample> samples_of(const GenerationOutput& generated) {
  const auto prompts = generated.prompts.cpu(), prompt_mask = generated.prompt_mask.cpu();
  const auto responses = generated.responses.cpu(), response_mask = generated.response_mask.cpu();
  const auto log_probs = generated.log_probs.cpu();
  std::vector<Sample> s(static_cast<size_t>(prompts.size(0)));
  for (int64_t q = 0; q < prompts.size(0); ++q) {
    for (int64_t t = 0; t < prompts.size(1); ++t)
      if (prompt_mask[q][t].item<int64_t>() != 0) s[q].prompt.push_back(prompts[q][t].item<int64_t>());
    for (int64_t t = 0; t < responses.size(1); ++t)
      if (response_mask[q][t].item<int64_t>() != 0) {
        s[q].response.push_back(responses[q][t].item<int64_t>());
        s[q].rollout.push_back(log_probs[q][t].item<float>());
      }
  }
  return s;
}

// The actor's recomputation for `rows` of `samples` in one micro-batch: prompts left-padded to the longest plus
// `left_extra`, responses right-padded to the longest plus `right_extra`, one full forward. Returns each row's
// log-probs at its real response tokens.
inline std::vector<std::vector<float>> recompute(CausalLM& model, const std::vector<Sample>& samples,
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
  const auto device = model->parameters().front().device();
  const auto lp =
      response_log_probs(model, ids.to(device), mask.to(device), r, kTemperature, /*with_entropy=*/false).log_probs.cpu();
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
inline std::vector<std::vector<std::vector<float>>> every_layout(CausalLM& model, const std::vector<Sample>& samples) {
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

// One generation path of the rollout: continuous batching on paged blocks or slots, the static batch, or
// recomputation without a cache; max_num_seqs and samples per prompt.
struct RolloutCase {
  std::string preset;
  bool continuous, paged, use_cache;
  int64_t max_num_seqs, n;
};

inline std::vector<RolloutCase> rollout_cases() {
  return {{"tiny", true, true, true, 0, 1},         {"tiny", true, true, true, 2, 3},
          {"tiny", true, false, true, 3, 1},        {"tiny", true, false, true, 0, 2},
          {"tiny", false, false, true, 0, 2},       {"tiny", false, false, false, 0, 1},
          {"qwen2-tiny", true, true, true, 0, 2},   {"qwen3-tiny", true, true, true, 4, 2},
          {"mistral-tiny", true, true, true, 0, 2}, {"mistral-tiny", false, false, true, 0, 1}};
}

inline std::string rollout_case_name(const ::testing::TestParamInfo<RolloutCase>& info) {
  const RolloutCase& c = info.param;
  std::string name = c.preset + (c.use_cache ? (c.continuous ? (c.paged ? "_paged" : "_slots") : "_static") : "_nocache");
  name += "_seqs" + std::to_string(c.max_num_seqs) + "_n" + std::to_string(c.n);
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
}

// Generates kPrompts on `device` in the mode along the case's path, then checks every layout's recomputed
// log-probs equal the recorded ones bit for bit.
inline void expect_recorded_equal_every_recomputation(const RolloutCase& c, const torch::Device& device) {
  CausalLM model = make_model(c.preset, device);
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

}  // namespace hybridflow::testing::batch_invariant_layouts
