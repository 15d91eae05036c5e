#include "hybridflow/engine/model_log_probs.h"

#include "hybridflow/core/error.h"

namespace hybridflow {

TokenLogProbs response_log_probs(CausalLM& model, const torch::Tensor& input_ids,
                                 const torch::Tensor& attention_mask, int64_t response_len, double temperature,
                                 bool with_entropy) {
  HF_CHECK(input_ids.dim() == 2, "response_log_probs: input_ids must be [B, L], got ", input_ids.sizes());
  const int64_t total = input_ids.size(1);
  HF_CHECK(response_len > 0 && response_len < total, "response_log_probs: response_len ", response_len,
           " must be in [1, ", total - 1, "] for sequences of length ", total);
  HF_CHECK(temperature > 0, "response_log_probs: temperature must be > 0, got ", temperature);
  // The head only at the R positions that predict response tokens (t = P-1 .. L-2): with a real
  // vocabulary, logits at every prompt position were most of the time and memory of the whole step.
  torch::Tensor hidden = model->hidden_states(input_ids, attention_mask);
  torch::Tensor z = model->apply_head(hidden.narrow(1, total - response_len - 1, response_len)).logits;
  if (temperature != 1.0) z = z / temperature;
  return token_log_probs(z, input_ids.narrow(1, total - response_len, response_len), with_entropy,
                         model->tensor_parallel());
}

}  // namespace hybridflow
