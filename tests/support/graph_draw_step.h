// The step a drawing decode graph captures (engine/decode_graphs.h: decode_and_draw_step, from static buffers
// with nothing read back) against the eager step (decode_paged, then the draw), run side by side on two copies
// of one paged cache for several steps, each feeding its own tokens to the next: the same tokens, log-probs
// to rounding (the captured step attends over a padded span). On any device the model is on.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "engine/generation_steps.h"
#include "hybridflow/engine/block_manager.h"
#include "hybridflow/engine/decode_graphs.h"
#include "hybridflow/model/rotary.h"

namespace hybridflow::testing {

// The read-back tests' generation on the GPU: sampled (temperature, top-p) or greedy, two samples of up to 29
// tokens for each prompt, 4 slots (rows join and leave), blocks of 4 positions and eos ids 3, 4 and 5.
inline GenerationConfig readback_parity_config(bool greedy) {
  GenerationConfig cfg;
  cfg.greedy = greedy;
  cfg.temperature = 1.2;
  cfg.top_p = 0.95;
  cfg.seed = 31;
  cfg.max_new_tokens = 29;
  cfg.n = 2;
  cfg.max_num_seqs = 4;
  cfg.kv_block_size = 4;
  cfg.eos_token_ids = {3, 4, 5};
  return cfg;
}

inline void expect_graph_draw_step_matches_eager(CausalLM& model, bool greedy, double log_prob_tolerance) {
  torch::NoGradGuard no_grad;
  model->eval();
  ASSERT_TRUE(model->decodes_on_device());
  const torch::Device device = model->parameters().front().device();
  const auto i64 = torch::TensorOptions().dtype(torch::kInt64).device(device);
  const std::vector<std::vector<int64_t>> prompts = {{5, 9, 2, 30, 7}, {1, 12}, {40, 3, 3, 8, 8, 1, 2}};
  const int64_t rows = 3, steps = 9, block_size = 4, span = 20, width = span / block_size;
  GenerationConfig cfg = readback_parity_config(greedy);
  cfg.top_k = 30;
  BlockManager blocks(rows * width, block_size);
  const int64_t pad_block = blocks.num_blocks();  // owned by no sequence: the padded rows' tables point there
  PagedKVCache eager, captured;
  std::vector<int64_t> sequences, lengths, first_inputs;
  for (const auto& prompt : prompts) {
    // The cache holds the prompt but its last id, the first step's input.
    const auto cached = static_cast<int64_t>(prompt.size()) - 1;
    KVCache prefill;
    prefill.capacity = cached;
    const auto ids = torch::tensor(std::vector<int64_t>(prompt.begin(), prompt.end() - 1), torch::kInt64).view({1, cached});
    model->hidden_states(ids.to(device), torch::ones({1, cached}, i64), torch::arange(cached, i64).view({1, cached}),
                         &prefill);
    if (eager.keys.empty())
      for (const auto& k : prefill.keys)
        for (PagedKVCache* cache : {&eager, &captured}) {
          cache->keys.push_back(torch::zeros({pad_block + 1, k.size(1), block_size, k.size(3)}, k.options()));
          cache->values.push_back(torch::zeros({pad_block + 1, k.size(1), block_size, k.size(3)}, k.options()));
        }
    sequences.push_back(blocks.admit(cached, 1, cached + steps).front());
    for (PagedKVCache* cache : {&eager, &captured}) cache->write_prefill(prefill, {blocks.table(sequences.back())}, {cached});
    lengths.push_back(cached);
    first_inputs.push_back(prompt.back());
  }
  const RotaryFrequencies rotary = [&] {
    RotaryFrequencies r = rotary_frequencies(model->config(), 0);
    r.inv_freq = r.inv_freq.to(device);
    return r;
  }();
  const torch::Tensor uniforms =
      greedy ? torch::Tensor() : generation::sampling_uniforms(cfg, {0, 1, 2}, {0, 0, 0}, steps, device);
  // The captured step's static buffers, filled by device copies only.
  torch::Tensor eager_input = torch::tensor(first_inputs, torch::kInt64).to(device);
  const torch::Tensor static_tokens = eager_input.view({rows, 1}).clone();
  const torch::Tensor static_tables = torch::full({rows, width}, pad_block, i64);
  const torch::Tensor static_lengths = torch::zeros({rows}, i64);
  bool some_differ = false;
  for (int64_t k = 0; k < steps; ++k) {
    std::vector<std::vector<int64_t>> tables;
    for (int64_t r = 0; r < rows; ++r) {
      blocks.append(sequences[static_cast<size_t>(r)]);
      tables.push_back(blocks.table(sequences[static_cast<size_t>(r)]));
      static_tables[r].narrow(0, 0, static_cast<int64_t>(tables.back().size()))
          .copy_(torch::tensor(tables.back(), torch::kInt64));
    }
    static_lengths.copy_(torch::tensor(lengths, torch::kInt64));
    const torch::Tensor u = uniforms.defined() ? uniforms[k] : uniforms;
    const torch::Tensor hidden = model->decode_paged(eager_input.view({rows, 1}), tables, lengths, eager);
    const generation::TokenDraw want = generation::choose_tokens_on_device(model, hidden.select(1, 0), cfg, u);
    const DecodeDraw got =
        decode_and_draw_step(model, cfg, static_tokens, static_tables, static_lengths, span, rotary, captured, u);
    const std::string what = std::string(greedy ? "greedy" : "sampled") + " step " + std::to_string(k);
    EXPECT_TRUE(torch::equal(got.tokens.cpu(), want.tokens.cpu())) << what;
    EXPECT_TRUE(torch::allclose(got.log_probs.cpu().to(torch::kFloat32), want.log_probs.cpu().to(torch::kFloat32), 0,
                                log_prob_tolerance))
        << what;
    EXPECT_EQ(got.no_mass.defined(), !greedy) << what;
    some_differ = some_differ || !torch::equal(want.tokens.cpu(), eager_input.cpu());
    eager_input = want.tokens;
    static_tokens.copy_(got.tokens.view({rows, 1}));
    for (int64_t& length : lengths) ++length;
  }
  EXPECT_TRUE(some_differ) << "the steps drew the same tokens again and again";
}

}  // namespace hybridflow::testing
