#include "hybridflow/algo/masked.h"

#include <torch/torch.h>

#include "hybridflow/core/error.h"

namespace hybridflow::algo {
namespace {

at::Tensor mask_like(const at::Tensor& values, const at::Tensor& mask) {
  HF_CHECK(values.defined() && mask.defined(), "algo: masked op needs defined values and mask");
  HF_CHECK(values.sizes() == mask.sizes(), "algo: mask shape ", mask.sizes(), " must equal values shape ",
           values.sizes());
  return mask.to(values.scalar_type());
}

// a / b where b > 0, else 0: keeps an all-padding row or batch finite.
at::Tensor safe_div(const at::Tensor& num, const at::Tensor& den) {
  auto positive = den > 0;
  return torch::where(positive, num / torch::where(positive, den, torch::ones_like(den)), torch::zeros_like(num));
}

// values * mask with the entries outside the mask zeroed first: NaN * 0 and inf * 0 are NaN, so a garbage
// value at a padded position (an overflowed ratio, a log of 0) would otherwise poison every reduction.
at::Tensor masked_product(const at::Tensor& values, const at::Tensor& mask) {
  auto m = mask_like(values, mask);
  return torch::where(m != 0, values, torch::zeros_like(values)) * m;
}

// Rows of a [B, R] mask with at least one valid token (verl's seq_mask), as a scalar tensor.
at::Tensor rows_with_tokens(const at::Tensor& mask) { return (mask != 0).any(1).sum(); }

}  // namespace

at::Tensor masked_sum(const at::Tensor& values, const at::Tensor& mask, std::optional<int64_t> dim) {
  auto prod = masked_product(values, mask);
  return dim ? prod.sum(*dim) : prod.sum();
}

at::Tensor masked_mean(const at::Tensor& values, const at::Tensor& mask, std::optional<int64_t> dim) {
  auto m = mask_like(values, mask);
  auto count = dim ? m.sum(*dim) : m.sum();
  return safe_div(masked_sum(values, m, dim), count);
}

at::Tensor masked_var(const at::Tensor& values, const at::Tensor& mask, bool unbiased) {
  auto m = mask_like(values, mask);
  auto mean = masked_mean(values, m);
  auto centered = values - mean;
  auto var = masked_mean(centered * centered, m);
  if (!unbiased) return var;
  auto count = m.sum();
  auto bessel = safe_div(count, count - 1);
  return torch::where(count > 1, var * bessel, torch::zeros_like(var));
}

at::Tensor masked_whiten(const at::Tensor& values, const at::Tensor& mask, bool shift_mean, double eps) {
  auto m = mask_like(values, mask);
  auto mean = masked_mean(values, m);
  auto var = masked_var(values, m, /*unbiased=*/true);
  auto whitened = (values - mean) * torch::rsqrt(var + eps);
  if (!shift_mean) whitened = whitened + mean;
  return masked_product(whitened, m);
}

LossAggMode parse_loss_agg_mode(const std::string& name) {
  if (name == "token-mean") return LossAggMode::kTokenMean;
  if (name == "seq-mean-token-sum") return LossAggMode::kSeqMeanTokenSum;
  if (name == "seq-mean-token-mean") return LossAggMode::kSeqMeanTokenMean;
  if (name == "seq-mean-token-sum-norm") return LossAggMode::kSeqMeanTokenSumNorm;
  if (name == "token-sum") return LossAggMode::kTokenSum;
  HF_FAIL("algo: unknown loss_agg_mode '", name,
          "' (expected token-mean, token-sum, seq-mean-token-sum, seq-mean-token-mean or seq-mean-token-sum-norm)");
}

std::string to_string(LossAggMode mode) {
  switch (mode) {
    case LossAggMode::kTokenMean: return "token-mean";
    case LossAggMode::kSeqMeanTokenSum: return "seq-mean-token-sum";
    case LossAggMode::kSeqMeanTokenMean: return "seq-mean-token-mean";
    case LossAggMode::kSeqMeanTokenSumNorm: return "seq-mean-token-sum-norm";
    case LossAggMode::kTokenSum: return "token-sum";
  }
  return "?";
}

int64_t non_empty_rows(const at::Tensor& mask) {
  HF_CHECK(mask.dim() == 2, "algo: non_empty_rows expects a [B, R] mask, got shape ", mask.sizes());
  return rows_with_tokens(mask).item<int64_t>();
}

at::Tensor agg_loss(const at::Tensor& loss_mat, const at::Tensor& mask, LossAggMode mode,
                    std::optional<double> loss_scale_factor) {
  HF_CHECK(loss_mat.dim() == 2, "algo: agg_loss expects a [B, R] loss, got shape ", loss_mat.sizes());
  auto m = mask_like(loss_mat, mask);
  // The seq-mean modes average over the rows with at least one valid token: an all-padding row neither
  // adds to the sum nor to the count. (Counted only in those modes: token-mean is the hot default.)
  auto rows = [&] { return rows_with_tokens(m).to(loss_mat.scalar_type()); };
  switch (mode) {
    case LossAggMode::kTokenMean:
      return masked_mean(loss_mat, m);
    case LossAggMode::kTokenSum:
      return masked_sum(loss_mat, m);
    case LossAggMode::kSeqMeanTokenSum:
      return safe_div(masked_sum(loss_mat, m), rows());
    case LossAggMode::kSeqMeanTokenMean:
      // masked_mean is 0 on an empty row, so the sum runs over the non-empty rows only.
      return safe_div(masked_mean(loss_mat, m, -1).sum(), rows());
    case LossAggMode::kSeqMeanTokenSumNorm: {
      // Dr. GRPO: per-row token sums over a constant length instead of each row's own length.
      const double scale = loss_scale_factor.value_or(static_cast<double>(loss_mat.size(1)));
      HF_CHECK(scale > 0, "algo: loss_scale_factor must be > 0, got ", scale);
      return safe_div(masked_sum(loss_mat, m), rows()) / scale;
    }
  }
  HF_FAIL("algo: unhandled loss aggregation mode");
}

}  // namespace hybridflow::algo
