// The decoder's RMSNorm, in transformers' arithmetic for Llama / Qwen2 / Qwen3: x in float32 times
// rsqrt(mean(x^2) + eps), rounded to x's dtype, times the weight.
//
// On a GPU a pass that records gradients (training, and its recomputation under activation checkpointing)
// takes libtorch's fused RMSNorm instead (at::rms_norm, whose CUDA kernel is _fused_rms_norm): one kernel
// forward and one backward where the operators make about eight kernels each way, with their float32
// intermediates written to and read from memory at every token.
// It rounds once (normed value times weight) where the operators round twice; the passes without gradients
// (generation, log-probs) keep the operators, whose rounding the fused decode kernels reproduce bit for bit.
// HF_FUSED_RMS_NORM=off keeps the operators in training too (to measure one against the other).
#pragma once

#include <torch/torch.h>

namespace hybridflow {

torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps);

// Whether rms_norm takes the fused kernel for x and weight now (a CUDA tensor, one dtype, gradients recorded
// and wanted, not switched off).
bool rms_norm_fused_for(const torch::Tensor& x, const torch::Tensor& weight);

}  // namespace hybridflow
