#include "hybridflow/algo/rollout_correction.h"

#include <torch/torch.h>

#include "checks.h"
#include "hybridflow/algo/masked.h"

namespace hybridflow::algo {

RolloutCorrectionConfig rollout_correction_config(const Config& algorithm) {
  RolloutCorrectionConfig c;
  const std::string level_key = "rollout_correction.rollout_is";
  if (!algorithm.is_null(level_key)) {
    const std::string level = algorithm.get<std::string>(level_key);
    if (level == "token")
      c.level = RolloutIsLevel::kToken;
    else if (level == "sequence")
      c.level = RolloutIsLevel::kSequence;
    else
      HF_FAIL("algorithm.rollout_correction.rollout_is: expected null (off), token or sequence, got '", level, "'");
  }
  c.threshold = algorithm.get<double>("rollout_correction.rollout_is_threshold");
  HF_CHECK(c.threshold > 0, "algorithm.rollout_correction.rollout_is_threshold must be > 0, got ", c.threshold);
  return c;
}

RolloutCorrection rollout_correction(const at::Tensor& old_log_prob, const at::Tensor& rollout_log_prob,
                                     const at::Tensor& response_mask, const RolloutCorrectionConfig& config) {
  constexpr const char* kWhere = "algo: rollout_correction";
  detail::check_response_tensor(old_log_prob, "old_log_prob", kWhere);
  detail::check_same_shape(rollout_log_prob, old_log_prob, "rollout_log_prob", kWhere);
  detail::check_same_shape(response_mask, old_log_prob, "response_mask", kWhere);
  torch::NoGradGuard no_grad;
  const auto mask = response_mask.to(torch::kDouble);
  const auto valid = mask != 0;
  const auto zero = torch::zeros_like(mask);
  // pi_old / pi_rollout in log space, 0 at padding.
  const auto log_ratio =
      torch::where(valid, old_log_prob.to(torch::kDouble) - rollout_log_prob.to(torch::kDouble), zero);
  RolloutCorrection out;
  out.metrics["rollout_corr/kl"] = masked_mean(-log_ratio, mask).item<double>();
  out.metrics["rollout_corr/k3_kl"] = masked_mean(torch::exp(log_ratio) - log_ratio - 1.0, mask).item<double>();
  const auto lengths = mask.sum(-1).clamp_min(1.0);
  // log ppl = -mean log-prob over the row; rollout minus training = the row's mean of log_ratio.
  out.metrics["rollout_corr/log_ppl_diff"] = ((log_ratio * mask).sum(-1) / lengths).mean().item<double>();
  if (config.level == RolloutIsLevel::kOff) return out;
  at::Tensor raw;  // [B, R], the untruncated weight of each token
  if (config.level == RolloutIsLevel::kToken) {
    raw = torch::exp(log_ratio.clamp(-20.0, 20.0));
  } else {
    raw = torch::exp((log_ratio * mask).sum(-1, /*keepdim=*/true).clamp(-20.0, 20.0)).expand_as(log_ratio);
  }
  out.metrics["rollout_corr/rollout_is_mean"] = masked_mean(raw, mask).item<double>();
  out.metrics["rollout_corr/rollout_is_max"] =
      mask.sum().item<double>() > 0 ? raw.masked_select(valid).max().item<double>() : 1.0;
  out.metrics["rollout_corr/rollout_is_ratio_fraction_high"] =
      masked_mean((raw > config.threshold).to(torch::kDouble), mask).item<double>();
  out.weights = torch::where(valid, raw.clamp_max(config.threshold), zero).to(torch::kFloat).contiguous();
  return out;
}

}  // namespace hybridflow::algo
