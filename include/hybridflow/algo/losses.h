// Actor and critic losses of PPO-style training (verl's core_algos names). All take [B, R] tensors with a
// response_mask and aggregate with a LossAggMode; diagnostics (clip fractions, KL) are detached scalars.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

#include "hybridflow/algo/masked.h"

namespace hybridflow::algo {

struct PolicyLossConfig {
  double clip_ratio = 0.2;                 // actor.clip_ratio, used for a side left unset
  std::optional<double> clip_ratio_low;    // actor.clip_ratio_low: ratio >= 1 - low
  std::optional<double> clip_ratio_high;   // actor.clip_ratio_high: ratio <= 1 + high (DAPO's clip-higher)
  double clip_ratio_c = 3.0;               // actor.clip_ratio_c: dual-clip bound for A < 0, must be > 1
  LossAggMode agg_mode = LossAggMode::kTokenMean;
};

struct PolicyLossOutput {
  at::Tensor loss;             // scalar, differentiable w.r.t. log_prob
  at::Tensor clip_frac;        // fraction of valid tokens where the ratio clip was active
  at::Tensor approx_kl;        // masked mean of old_log_prob - log_prob
  at::Tensor clip_frac_lower;  // fraction of valid tokens where the dual clip (A < 0) was active
};

// L = max(-A r, -A clip(r, 1 - low, 1 + high)); for A < 0 additionally min(L, -A clip_ratio_c).
// r = exp(log_prob - old_log_prob), the log-ratio clamped to [-20, 20] against overflow.
PolicyLossOutput ppo_policy_loss(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                                 const at::Tensor& advantages, const at::Tensor& response_mask,
                                 const PolicyLossConfig& config = {});

struct ValueLossOutput {
  at::Tensor loss;       // scalar 0.5 * agg(max((v - R)^2, (clip(v, V_old +- c) - R)^2))
  at::Tensor clip_frac;  // fraction of valid tokens where the clipped term was larger
};

ValueLossOutput clipped_value_loss(const at::Tensor& vpreds, const at::Tensor& old_values, const at::Tensor& returns,
                                   const at::Tensor& response_mask, double cliprange_value,
                                   LossAggMode agg_mode = LossAggMode::kTokenMean);

// Entropy of the categorical distribution of logits [..., V] over its last dim: logsumexp(z) - sum softmax(z) z.
at::Tensor entropy_from_logits(const at::Tensor& logits);

// Aggregated token entropy of logits [B, R, V]; the actor loss subtracts entropy_coeff times this.
at::Tensor entropy_loss(const at::Tensor& logits, const at::Tensor& response_mask,
                        LossAggMode agg_mode = LossAggMode::kTokenMean);

}  // namespace hybridflow::algo
