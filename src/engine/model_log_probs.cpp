#include "hybridflow/engine/model_log_probs.h"

namespace hybridflow {

TokenLogProbs response_log_probs(CausalLM& model, const torch::Tensor& input_ids,
                                 const torch::Tensor& attention_mask, int64_t response_len, double temperature,
                                 bool with_entropy) {
  LogitsFn forward = [&model](const torch::Tensor& ids, const torch::Tensor& mask) {
    return model->forward(ids, mask).logits;
  };
  return response_log_probs(forward, input_ids, attention_mask, response_len, temperature, with_entropy,
                            model->tensor_parallel());
}

}  // namespace hybridflow
