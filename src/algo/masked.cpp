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

}  // namespace

at::Tensor masked_sum(const at::Tensor& values, const at::Tensor& mask, std::optional<int64_t> dim) {
  auto m = mask_like(values, mask);
  auto prod = values * m;
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
  return whitened * m;
}

LossAggMode parse_loss_agg_mode(const std::string& name) {
  if (name == "token-mean") return LossAggMode::kTokenMean;
  if (name == "seq-mean-token-sum") return LossAggMode::kSeqMeanTokenSum;
  if (name == "seq-mean-token-mean") return LossAggMode::kSeqMeanTokenMean;
  if (name == "seq-mean-token-sum-norm") return LossAggMode::kSeqMeanTokenSumNorm;
  HF_FAIL("algo: unknown loss_agg_mode '", name,
          "' (expected token-mean, seq-mean-token-sum, seq-mean-token-mean or seq-mean-token-sum-norm)");
}

std::string to_string(LossAggMode mode) {
  switch (mode) {
    case LossAggMode::kTokenMean: return "token-mean";
    case LossAggMode::kSeqMeanTokenSum: return "seq-mean-token-sum";
    case LossAggMode::kSeqMeanTokenMean: return "seq-mean-token-mean";
    case LossAggMode::kSeqMeanTokenSumNorm: return "seq-mean-token-sum-norm";
  }
  return "?";
}

at::Tensor agg_loss(const at::Tensor& loss_mat, const at::Tensor& mask, LossAggMode mode) {
  HF_CHECK(loss_mat.dim() == 2, "algo: agg_loss expects a [B, R] loss, got shape ", loss_mat.sizes());
  auto m = mask_like(loss_mat, mask);
  switch (mode) {
    case LossAggMode::kTokenMean:
      return masked_mean(loss_mat, m);
    case LossAggMode::kSeqMeanTokenSum:
      return masked_sum(loss_mat, m, -1).mean();
    case LossAggMode::kSeqMeanTokenMean:
      return masked_mean(loss_mat, m, -1).mean();
    case LossAggMode::kSeqMeanTokenSumNorm:
      // verl divides by the (fixed) response length only, so the scale does not depend on the batch's lengths.
      return masked_sum(loss_mat, m) / static_cast<double>(loss_mat.size(1));
  }
  HF_FAIL("algo: unhandled loss aggregation mode");
}

}  // namespace hybridflow::algo
