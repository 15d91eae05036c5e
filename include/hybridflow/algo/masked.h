// Statistics over the valid tokens of a [B, R] response tensor, and the loss aggregation modes.
// Padding (mask 0) never contributes, not even a NaN or inf stored there (it is zeroed before the
// multiplication by the mask); an empty mask yields 0 rather than NaN.
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

// How a [B, R] per-token loss becomes a scalar (verl's actor.loss_agg_mode). "Sequences" are the rows with at
// least one valid token (verl's seq_mask); N = their number, S_i = row i's valid-token sum, n_i its count.
enum class LossAggMode {
  kTokenMean,            // "token-mean": sum_i S_i / sum_i n_i
  kSeqMeanTokenSum,      // "seq-mean-token-sum": sum_i S_i / N
  kSeqMeanTokenMean,     // "seq-mean-token-mean": sum_i (S_i / n_i) / N
  kSeqMeanTokenSumNorm,  // "seq-mean-token-sum-norm" (Dr. GRPO): sum_i S_i / N / loss_scale_factor (default R)
  kTokenSum              // "token-sum": sum_i S_i, no normalisation
};

// Throws hybridflow::Error naming the accepted spellings.
LossAggMode parse_loss_agg_mode(const std::string& name);
std::string to_string(LossAggMode mode);

// Aggregates loss_mat [B, R] over the valid tokens. loss_scale_factor (verl's actor.loss_scale_factor) is
// the constant length of seq-mean-token-sum-norm; unset, it is R = loss_mat.size(1), which changes with the
// batch's padding. The other modes ignore it.
at::Tensor agg_loss(const at::Tensor& loss_mat, const at::Tensor& mask, LossAggMode mode,
                    std::optional<double> loss_scale_factor = std::nullopt);

// Rows of a [B, R] mask with at least one nonzero entry: the N of the seq-mean modes.
int64_t non_empty_rows(const at::Tensor& mask);

}  // namespace hybridflow::algo
