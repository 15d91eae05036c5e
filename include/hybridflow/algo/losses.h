// Actor and critic losses of PPO-style training (verl's core_algos names). All take [B, R] tensors with a
// response_mask and aggregate with a LossAggMode; diagnostics (clip fractions, KL) are detached scalars.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>

#include "hybridflow/algo/masked.h"

namespace hybridflow::algo {

// verl's actor.policy_loss.loss_mode: which importance ratio the clipped surrogate uses.
enum class PolicyLossMode {
  kVanilla,  // "vanilla": per-token ratio, dual clip (ppo_policy_loss)
  kGspo      // "gspo": one sequence-level ratio per row (gspo_policy_loss)
};
PolicyLossMode parse_policy_loss_mode(const std::string& name);  // throws naming the accepted spellings
std::string to_string(PolicyLossMode mode);

struct PolicyLossConfig {
  // actor.clip_ratio, used for a side left unset. verl instead defaults each side to 0.2 on its own, so a
  // config that changes only clip_ratio clips differently in the two (policy_loss_config warns).
  double clip_ratio = 0.2;
  std::optional<double> clip_ratio_low;    // actor.clip_ratio_low: ratio >= 1 - low
  std::optional<double> clip_ratio_high;   // actor.clip_ratio_high: ratio <= 1 + high (DAPO's clip-higher)
  double clip_ratio_c = 3.0;               // actor.clip_ratio_c: dual-clip bound for A < 0, must be > 1
  LossAggMode agg_mode = LossAggMode::kTokenMean;
  std::optional<double> loss_scale_factor;  // actor.loss_scale_factor: seq-mean-token-sum-norm's constant
  PolicyLossMode loss_mode = PolicyLossMode::kVanilla;  // actor.policy_loss.loss_mode

  // The aggregation the policy loss really uses: GSPO always averages per sequence (seq-mean-token-mean),
  // whatever agg_mode says, as verl's compute_policy_loss_gspo does.
  LossAggMode policy_agg_mode() const {
    return loss_mode == PolicyLossMode::kGspo ? LossAggMode::kSeqMeanTokenMean : agg_mode;
  }
};

struct PolicyLossOutput {
  at::Tensor loss;             // scalar, differentiable w.r.t. log_prob
  at::Tensor clip_frac;        // fraction of valid tokens where the ratio clip was active
  at::Tensor approx_kl;        // masked mean of old_log_prob - log_prob
  at::Tensor clip_frac_lower;  // fraction of valid tokens where the dual clip (A < 0) was active
};

// L = max(-A r, -A clip(r, 1 - low, 1 + high)); for A < 0 additionally min(L, -A clip_ratio_c).
// r = exp(log_prob - old_log_prob), the log-ratio clamped to [-20, 20] against overflow.
// Masked-out positions are zeroed in the inputs first, so a NaN/inf stored there reaches neither the loss
// nor its gradient. verl's compute_policy_loss_vanilla. `rollout_is_weights` [B, R] (optional, detached:
// algo/rollout_correction.h) multiplies each token's loss before aggregation, as verl's rollout correction.
PolicyLossOutput ppo_policy_loss(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                                 const at::Tensor& advantages, const at::Tensor& response_mask,
                                 const PolicyLossConfig& config = {}, const at::Tensor& rollout_is_weights = {});

// GSPO (arXiv 2507.18071), verl's compute_policy_loss_gspo: row i's log-ratio is the mean over its valid
// tokens, k_i = sum_t m_it (log_prob - old_log_prob)_it / max(n_i, 1); every token of the row uses
// s_it = exp(min(sg[k_i] + log_prob_it - sg[log_prob_it], 10)) (value exp(k_i), gradient that of the token's
// own log-prob), L_it = max(-A s_it, -A clip(s_it, 1 - low, 1 + high)), aggregated seq-mean-token-mean
// (config.agg_mode is not used). No dual clip: clip_frac_lower is 0.
PolicyLossOutput gspo_policy_loss(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                                  const at::Tensor& advantages, const at::Tensor& response_mask,
                                  const PolicyLossConfig& config = {}, const at::Tensor& rollout_is_weights = {});

// ppo_policy_loss or gspo_policy_loss, as config.loss_mode says.
PolicyLossOutput policy_loss(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                             const at::Tensor& advantages, const at::Tensor& response_mask,
                             const PolicyLossConfig& config = {}, const at::Tensor& rollout_is_weights = {});

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
