// response_log_probs for a CausalLM (kept apart from log_probs.h so the pure tensor part has no
// link dependency on the model).
#pragma once

#include "hybridflow/engine/log_probs.h"
#include "hybridflow/model/transformer.h"

namespace hybridflow {

// input_ids [B, P + R] = prompt (left padded) + response (right padded); attention_mask likewise.
// Returns log-probs / entropy (and with_sum_pi_squared, no gradients: engine/head_log_probs.h) of the R
// response tokens, [B, R].
TokenLogProbs response_log_probs(CausalLM& model, const torch::Tensor& input_ids,
                                 const torch::Tensor& attention_mask, int64_t response_len,
                                 double temperature = 1.0, bool with_entropy = true, bool with_sum_pi_squared = false);

}  // namespace hybridflow
