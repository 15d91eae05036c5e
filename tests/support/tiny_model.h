// The tiny decoders tests build their models from, in one place: a base (ModelConfig's Llama defaults, or a
// preset such as "tiny" or "qwen2-tiny") with the few sizes a test picks, optionally fitted to a tokenizer,
// and a model drawn from a fixed seed. A test names only the sizes it depends on, e.g.
//   tiny_model_config({.vocab_size = 48, .hidden_size = 64, .intermediate_size = 128})
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>

#include "hybridflow/model/model_config.h"
#include "hybridflow/model/tokenizer.h"
#include "hybridflow/model/transformer.h"

namespace hybridflow::testing {

// The sizes of a tiny decoder; the defaults are the ones most tests use.
struct TinyModel {
  int64_t vocab_size = 0;  // set from the tokenizer by the overload that takes one
  int64_t hidden_size = 32;
  int64_t intermediate_size = 64;
  int64_t num_hidden_layers = 2;
  int64_t num_attention_heads = 4;
  int64_t num_key_value_heads = 2;
  int64_t max_position_embeddings = 0;  // 0 keeps the base's (ModelConfig's 2048, or the preset's)
};

// The base with these sizes. The base is ModelConfig's defaults, or preset_model_config(preset, vocab_size).
inline ModelConfig tiny_model_config(const TinyModel& sizes, const std::string& preset = "") {
  ModelConfig c = preset.empty() ? ModelConfig{} : preset_model_config(preset, sizes.vocab_size);
  c.vocab_size = sizes.vocab_size;
  c.hidden_size = sizes.hidden_size;
  c.intermediate_size = sizes.intermediate_size;
  c.num_hidden_layers = sizes.num_hidden_layers;
  c.num_attention_heads = sizes.num_attention_heads;
  c.num_key_value_heads = sizes.num_key_value_heads;
  if (sizes.max_position_embeddings > 0) c.max_position_embeddings = sizes.max_position_embeddings;
  return c;
}

// The same for a tokenizer: its vocabulary and its bos, eos and pad ids.
inline ModelConfig tiny_model_config(const Tokenizer& tok, TinyModel sizes, const std::string& preset = "") {
  sizes.vocab_size = tok.vocab_size();
  ModelConfig c = tiny_model_config(sizes, preset);
  c.bos_token_id = tok.bos_id();
  c.eos_token_id = tok.eos_id();
  c.pad_token_id = tok.pad_id();
  return c;
}

// A model whose weights are drawn right after torch::manual_seed(seed), so tests that share a seed share
// the weights.
inline CausalLM seeded_model(const ModelConfig& config, uint64_t seed, HeadKind head = HeadKind::kLanguageModel) {
  torch::manual_seed(seed);
  return CausalLM(config, head);
}

// The multi-turn tests' model: a tiny qwen2 (vocabulary 41, hidden 32) drawn after seed 5 whose matrices are
// scaled up 6x, so that logits spread and sampled rows differ.
inline CausalLM spread_logits_model() {
  const ModelConfig config =
      tiny_model_config({.vocab_size = 41, .hidden_size = 32, .intermediate_size = 48}, "qwen2-tiny");
  CausalLM model = seeded_model(config, 5);
  torch::NoGradGuard no_grad;
  for (auto& p : model->parameters())
    if (p.dim() == 2) p.mul_(6.0);
  return model;
}

}  // namespace hybridflow::testing
