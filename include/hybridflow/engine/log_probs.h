// Per-token log-probabilities and entropies of a causal LM: what PPO needs for the old, reference and
// current policy, and what SFT's loss is made of.
#pragma once

#include <torch/torch.h>

#include <functional>

#include "hybridflow/parallel/tensor_parallel.h"

namespace hybridflow {

struct TokenLogProbs {
  torch::Tensor log_probs;  // [B, T] log p(target)
  torch::Tensor entropy;    // [B, T] entropy of the predicted distribution (undefined if not asked for)
  torch::Tensor sum_pi_squared;  // [B, T] sum over the vocabulary of p^2 (head_sum_pi_squared; only if asked for)
};

// logits [B, T, V] (any float dtype; computed in float32), targets [B, T] int64.
// Memory-lean: one log_softmax and a gather; entropy = logsumexp(z) - sum(softmax(z) * z).
// Under tensor parallelism logits are this rank's vocabulary slice [B, T, V / t] and the result is the
// same as one process's, computed without gathering the vocabulary (vocab_parallel_log_probs).
TokenLogProbs token_log_probs(const torch::Tensor& logits, const torch::Tensor& targets,
                              bool with_entropy = true, const TensorParallelGroup& tp = {});

// Runs a model over prompt + response and returns the log-probs of the last `response_len` tokens.
// `forward` maps (input_ids [B, L], attention_mask [B, L]) -> logits [B, L, V]. Logits at position t
// predict token t + 1, so the response token at position P + r is scored by the logits at P + r - 1.
// Logits are divided by `temperature` first (the rollout's sampling temperature, as in verl).
using LogitsFn = std::function<torch::Tensor(const torch::Tensor& input_ids, const torch::Tensor& attention_mask)>;
TokenLogProbs response_log_probs(const LogitsFn& forward, const torch::Tensor& input_ids,
                                 const torch::Tensor& attention_mask, int64_t response_len,
                                 double temperature = 1.0, bool with_entropy = true,
                                 const TensorParallelGroup& tp = {});

// The two halves of response_log_probs, for callers that compute logits only where they are needed (the
// model's head applied to the R scoring positions; model_log_probs.h):
// throws unless input_ids is [B, L], response_len is in [1, L - 1] and temperature > 0;
void check_response_window(const torch::Tensor& input_ids, int64_t response_len, double temperature);
// `window_logits` [B, R, V] are the logits at positions L-R-1 .. L-2, which score the last R tokens.
TokenLogProbs response_window_log_probs(const torch::Tensor& window_logits, const torch::Tensor& input_ids,
                                        int64_t response_len, double temperature, bool with_entropy,
                                        const TensorParallelGroup& tp);

}  // namespace hybridflow
