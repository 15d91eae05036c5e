// verl's rollout correction (algorithm.rollout_correction): the policy that generated a batch (a one-step
// stale standalone rollout, or generation in another dtype) is not the policy the actor computes its old
// log-probs with, so each token's policy loss is weighted by the truncated importance ratio
// min(pi_old / pi_rollout, threshold) (TIS), per token or with one ratio per sequence. Also the
// rollout/training mismatch metrics, logged whether or not the weights are applied.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <string>

#include "hybridflow/core/config.h"

namespace hybridflow::algo {

enum class RolloutIsLevel { kOff, kToken, kSequence };

struct RolloutCorrectionConfig {
  RolloutIsLevel level = RolloutIsLevel::kOff;  // rollout_is: null | token | sequence
  double threshold = 2.0;                       // rollout_is_threshold: the truncation cap (> 0)
};

// From the `algorithm` section (algorithm.rollout_correction.*); errors name the key and the accepted values.
RolloutCorrectionConfig rollout_correction_config(const Config& algorithm);

struct RolloutCorrection {
  at::Tensor weights;  // [B, R] truncated weights (0 at padding), detached; undefined when the level is off
  // rollout_corr/kl (mean of log pi_rollout - log pi_old over valid tokens), rollout_corr/k3_kl,
  // rollout_corr/log_ppl_diff (mean over rows of the rollout's minus the training's log-perplexity), and
  // with weights rollout_corr/rollout_is_mean, rollout_is_max (before truncation), rollout_is_ratio_fraction_high.
  std::map<std::string, double> metrics;
};

// old_log_prob, rollout_log_prob, response_mask: [B, R]. The log-ratio is clamped to [-20, 20] (per token
// or summed over the sequence) before exp, as verl does.
RolloutCorrection rollout_correction(const at::Tensor& old_log_prob, const at::Tensor& rollout_log_prob,
                                     const at::Tensor& response_mask, const RolloutCorrectionConfig& config);

}  // namespace hybridflow::algo
