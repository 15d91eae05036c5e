// Pieces every policy loss shares (losses.cpp and policy_loss_variants.cpp): input checks, the clip range, and
// the masking that keeps NaN/inf at padded positions out of the loss and its gradient.
#pragma once

#include <torch/torch.h>

#include "checks.h"
#include "hybridflow/algo/losses.h"

namespace hybridflow::algo::detail {

struct ClipRange {
  double low, high;
};

inline void check_policy_inputs(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                                const at::Tensor& advantages, const at::Tensor& response_mask, const char* where) {
  check_response_tensor(log_prob, "log_prob", where);
  check_same_shape(old_log_prob, log_prob, "old_log_prob", where);
  check_same_shape(advantages, log_prob, "advantages", where);
  check_same_shape(response_mask, log_prob, "response_mask", where);
}

// clip_ratio_low/high, each defaulting to clip_ratio. allow_no_lower_bound admits low >= 1 (CISPO leaves
// the weight unbounded below that way).
inline ClipRange clip_range(const PolicyLossConfig& config, const char* where, bool allow_no_lower_bound = false) {
  const ClipRange r{config.clip_ratio_low.value_or(config.clip_ratio),
                    config.clip_ratio_high.value_or(config.clip_ratio)};
  if (allow_no_lower_bound)
    HF_CHECK(r.low >= 0, where, ": clip_ratio_low must be >= 0, got ", r.low);
  else
    HF_CHECK(r.low >= 0 && r.low < 1, where, ": clip_ratio_low must be in [0, 1), got ", r.low);
  HF_CHECK(r.high >= 0, where, ": clip_ratio_high must be >= 0, got ", r.high);
  return r;
}

// t at the valid positions, 0 elsewhere: where() rather than t * mask, because a NaN or inf at a padded
// position times 0 is NaN, and its gradient through exp() would be NaN too.
inline at::Tensor valid_only(const at::Tensor& t, const at::Tensor& valid) {
  return torch::where(valid, t, torch::zeros_like(t));
}

// Each token's loss times its rollout importance weight (none: unchanged, so runs without the correction
// keep their exact numbers).
inline at::Tensor weighted(const at::Tensor& token_loss, const at::Tensor& weights, const at::Tensor& valid,
                           const char* where) {
  if (!weights.defined()) return token_loss;
  check_same_shape(weights, token_loss, "rollout_is_weights", where);
  return token_loss * valid_only(weights.to(token_loss.scalar_type()).detach(), valid);
}

}  // namespace hybridflow::algo::detail
