// The decoder's RMSNorm, in transformers' arithmetic for Llama / Qwen2 / Qwen3: x in float32 times
// rsqrt(mean(x^2) + eps), rounded to x's dtype, times the weight.
//
// On a GPU the model's passes take libtorch's fused RMSNorm instead (at::rms_norm, whose CUDA kernel is
// _fused_rms_norm): one kernel forward and one backward where the operators make about eight kernels each way,
// with their float32 intermediates written to and read from memory at every token. It rounds once (normed value
// times weight) where the operators round twice. The passes with and without gradients take the same kernel, so
// the old log-probs, the reference's and the update's first forward agree bit for bit (PPO's ratio starts at 1).
// Generation keeps the operators (an OperatorRmsNormScope around it): its fused decode kernels reproduce their
// rounding, and its prefill's keys and values are the decode steps' in that arithmetic.
// HF_FUSED_RMS_NORM=off keeps the operators everywhere (to measure one against the other).
#pragma once

#include <torch/torch.h>

namespace hybridflow {

torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps);

// Whether rms_norm takes the fused kernel for x and weight now (a CUDA tensor, one dtype, outside every
// OperatorRmsNormScope, not switched off).
bool rms_norm_fused_for(const torch::Tensor& x, const torch::Tensor& weight);

// While alive, this thread's rms_norm calls compute with the operators (generation's passes); nests.
class OperatorRmsNormScope {
 public:
  OperatorRmsNormScope();
  ~OperatorRmsNormScope();
  OperatorRmsNormScope(const OperatorRmsNormScope&) = delete;
  OperatorRmsNormScope& operator=(const OperatorRmsNormScope&) = delete;
};

}  // namespace hybridflow
