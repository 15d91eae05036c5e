#include "hybridflow/engine/model_log_probs.h"

#include "hybridflow/engine/head_log_probs.h"

namespace hybridflow {

TokenLogProbs response_log_probs(CausalLM& model, const torch::Tensor& input_ids,
                                 const torch::Tensor& attention_mask, int64_t response_len, double temperature,
                                 bool with_entropy, bool with_sum_pi_squared) {
  check_response_window(input_ids, response_len, temperature);
  // The head only at the R positions that predict response tokens (t = P-1 .. L-2): with a real
  // vocabulary, logits at every prompt position were most of the time and memory of the whole step. Even
  // those R positions' logits are never whole: head_log_probs goes a chunk of tokens at a time, forward and
  // backward, so memory does not grow with batch x R x vocabulary.
  const int64_t total = input_ids.size(1);
  torch::Tensor hidden = model->hidden_states(input_ids, attention_mask);
  const torch::Tensor window = hidden.narrow(1, total - response_len - 1, response_len);
  return head_log_probs(window, model->lm_head_weight(), input_ids.narrow(1, total - response_len, response_len),
                        temperature, with_entropy, model->tensor_parallel(), /*chunk_tokens=*/0, with_sum_pi_squared);
}

}  // namespace hybridflow
