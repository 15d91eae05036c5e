// Rotary position embeddings as transformers computes them, including its RoPE scaling types (linear,
// dynamic NTK, Llama 3, YaRN): the inverse frequencies of each rotated channel pair and the factor that
// scales cos and sin. Computed in float32 with the same operations, so positions rotate identically.
#pragma once

#include <torch/torch.h>

#include <utility>

#include "hybridflow/model/model_config.h"

namespace hybridflow {

struct RotaryFrequencies {
  torch::Tensor inv_freq;         // [head_dim / 2] float32
  double attention_scaling = 1.0;  // multiplies cos and sin (YaRN's attention factor; 1 otherwise)
};

// The frequencies for a forward whose largest position is max_position. Only dynamic scaling depends on
// it: beyond max_position_embeddings it raises the base for the sequence length max_position + 1.
// transformers keeps the largest length it has seen in the module, so a later shorter forward there can
// still use a raised base; here each forward uses its own length (the same within one generation).
RotaryFrequencies rotary_frequencies(const ModelConfig& config, int64_t max_position);

// cos and sin [B, 1, T, head_dim] for position_ids [B, T], cast to dtype.
std::pair<torch::Tensor, torch::Tensor> rotary_cos_sin(const torch::Tensor& position_ids, const ModelConfig& config,
                                                       torch::ScalarType dtype);
// The same from given frequencies (a CUDA graph's, kept on the device: no copy from the host in the step).
std::pair<torch::Tensor, torch::Tensor> rotary_cos_sin(const torch::Tensor& position_ids, const RotaryFrequencies& f,
                                                       torch::ScalarType dtype);

}  // namespace hybridflow
