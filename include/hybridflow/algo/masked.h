// Statistics over the valid tokens of a [B, R] response tensor, and the loss aggregation modes.
// Padding (mask 0) never contributes; an empty mask yields 0 rather than NaN.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>

namespace hybridflow::algo {

// Sum of values * mask, over all elements (dim unset) or along dim.
at::Tensor masked_sum(const at::Tensor& values, const at::Tensor& mask, std::optional<int64_t> dim = std::nullopt);

// Mean over the elements where mask != 0 (mask may be fractional weights); 0 where the mask sums to 0.
at::Tensor masked_mean(const at::Tensor& values, const at::Tensor& mask, std::optional<int64_t> dim = std::nullopt);

// Variance over all masked elements (a scalar). unbiased applies Bessel's correction n / (n - 1) like verl;
// with fewer than two valid elements the variance is 0 (there is nothing to spread).
at::Tensor masked_var(const at::Tensor& values, const at::Tensor& mask, bool unbiased = true);

// (values - mean) / sqrt(var + eps) with mean/var over masked elements; shift_mean=false adds the mean back.
// Positions outside the mask are set to 0.
at::Tensor masked_whiten(const at::Tensor& values, const at::Tensor& mask, bool shift_mean = true, double eps = 1e-8);

// How a [B, R] per-token loss becomes a scalar (verl's actor.loss_agg_mode).
enum class LossAggMode {
  kTokenMean,           // "token-mean": mean over all valid tokens of the batch
  kSeqMeanTokenSum,     // "seq-mean-token-sum": per-sequence token sum, mean over sequences
  kSeqMeanTokenMean,    // "seq-mean-token-mean": per-sequence token mean, mean over sequences
  kSeqMeanTokenSumNorm  // "seq-mean-token-sum-norm": total token sum / R (verl; Dr. GRPO)
};

// Throws hybridflow::Error naming the accepted spellings.
LossAggMode parse_loss_agg_mode(const std::string& name);
std::string to_string(LossAggMode mode);

// Aggregates loss_mat [B, R] over the valid tokens. Rows without valid tokens contribute 0 to the seq-mean modes.
at::Tensor agg_loss(const at::Tensor& loss_mat, const at::Tensor& mask, LossAggMode mode);

}  // namespace hybridflow::algo
