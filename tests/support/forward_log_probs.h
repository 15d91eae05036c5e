// The reference for a generator's recorded log-probs: one full forward over prompt + response.
#pragma once

#include <torch/torch.h>

#include "hybridflow/engine/generation.h"

namespace hybridflow::testing {

// Log-probs of the response tokens of `out` under `model` at `temperature`, 0 where masked.
inline torch::Tensor recomputed_log_probs(CausalLM& model, const GenerationOutput& out, double temperature) {
  torch::NoGradGuard no_grad;
  auto ids = torch::cat({out.prompts, out.responses}, 1);
  auto mask = torch::cat({out.prompt_mask, out.response_mask}, 1);
  const int64_t p = out.prompts.size(1), r = out.responses.size(1);
  auto logits = model->forward(ids, mask).logits.slice(1, p - 1, p - 1 + r);
  auto lp = torch::log_softmax(logits / temperature, -1).gather(-1, out.responses.unsqueeze(-1)).squeeze(-1);
  return lp * out.response_mask.to(torch::kFloat32);
}

}  // namespace hybridflow::testing
