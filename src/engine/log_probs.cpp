#include "hybridflow/engine/log_probs.h"

#include "hybridflow/core/error.h"

namespace hybridflow {

TokenLogProbs token_log_probs(const torch::Tensor& logits, const torch::Tensor& targets, bool with_entropy,
                              const TensorParallelGroup& tp) {
  HF_CHECK(logits.dim() == 3, "token_log_probs: logits must be [B, T, V], got ", logits.sizes());
  HF_CHECK(targets.dim() == 2 && targets.size(0) == logits.size(0) && targets.size(1) == logits.size(1),
           "token_log_probs: targets must be [B, T] = ", logits.sizes().slice(0, 2), ", got ", targets.sizes());
  if (tp.enabled()) {
    TokenLogProbs out;
    out.log_probs = vocab_parallel_log_probs(logits, targets, tp);
    if (with_entropy) out.entropy = vocab_parallel_entropy(logits, tp);
    return out;
  }
  torch::Tensor z = logits.to(torch::kFloat32);
  torch::Tensor log_p = torch::log_softmax(z, -1);
  TokenLogProbs out;
  out.log_probs = log_p.gather(-1, targets.to(torch::kLong).unsqueeze(-1)).squeeze(-1);
  if (with_entropy) {
    // H = logsumexp(z) - sum(p * z); p = exp(log_p) reuses the softmax already computed.
    torch::Tensor p = log_p.exp();
    out.entropy = torch::logsumexp(z, -1) - (p * z).sum(-1);
  }
  return out;
}

void check_response_window(const torch::Tensor& input_ids, int64_t response_len, double temperature) {
  HF_CHECK(input_ids.dim() == 2, "response_log_probs: input_ids must be [B, L], got ", input_ids.sizes());
  const int64_t total = input_ids.size(1);
  HF_CHECK(response_len > 0 && response_len < total, "response_log_probs: response_len ", response_len,
           " must be in [1, ", total - 1, "] for sequences of length ", total);
  HF_CHECK(temperature > 0, "response_log_probs: temperature must be > 0, got ", temperature);
}

TokenLogProbs response_window_log_probs(const torch::Tensor& window_logits, const torch::Tensor& input_ids,
                                        int64_t response_len, double temperature, bool with_entropy,
                                        const TensorParallelGroup& tp) {
  torch::Tensor z = temperature != 1.0 ? window_logits / temperature : window_logits;
  return token_log_probs(z, input_ids.narrow(1, input_ids.size(1) - response_len, response_len), with_entropy, tp);
}

TokenLogProbs response_log_probs(const LogitsFn& forward, const torch::Tensor& input_ids,
                                 const torch::Tensor& attention_mask, int64_t response_len, double temperature,
                                 bool with_entropy, const TensorParallelGroup& tp) {
  check_response_window(input_ids, response_len, temperature);
  const int64_t total = input_ids.size(1);
  torch::Tensor logits = forward(input_ids, attention_mask);
  HF_CHECK(logits.dim() == 3 && logits.size(1) == total, "response_log_probs: model returned logits ",
           logits.sizes(), ", expected [B, ", total, ", V]");
  // Only the R positions that predict response tokens: t = P-1 .. L-2.
  return response_window_log_probs(logits.narrow(1, total - response_len - 1, response_len), input_ids, response_len,
                                   temperature, with_entropy, tp);
}

}  // namespace hybridflow
