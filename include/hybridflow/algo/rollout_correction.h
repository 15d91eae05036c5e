// verl's rollout correction (algorithm.rollout_correction): the policy that generated a batch (a stale
// standalone rollout, or generation in another dtype) is not the policy the actor computes its old
// log-probs with. Two separate remedies, each at the level of a token, a whole sequence (the product of
// its token ratios) or a sequence's geometric mean (the exponential of its mean log-ratio):
//  - importance weights (rollout_is): each token's policy loss is multiplied by the ratio pi_old / pi_rollout,
//    truncated at an upper threshold (TIS), or, with a "lower_upper" threshold, zeroed outside [lower, upper]
//    (masked IS); optionally normalised to mean 1 over the batch;
//  - rejection (rollout_rs, and the per-token veto): tokens or sequences whose ratio falls outside
//    [lower, upper] leave the loss altogether, denominator included.
// Also the rollout/training mismatch metrics, logged whether or not anything is applied, and verl's
// bypass-mode REINFORCE loss (loss_type: reinforce).
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "hybridflow/algo/losses.h"
#include "hybridflow/core/config.h"

namespace hybridflow::algo {

// The level a ratio is taken at (rollout_is and rollout_rs share them).
enum class RolloutCorrLevel { kOff, kToken, kSequence, kGeometric };

// rollout_correction.loss_type: the policy loss in bypass mode.
enum class RolloutLossType {
  kPpoClip,   // "ppo_clip": the configured clipped loss with the rollout as the old policy
  kReinforce  // "reinforce": -A w log pi, w the (detached) correction weight of the current policy
};

// One of verl's divergence-estimator rejection criteria (rollout_rs "token_k1", "seq_max_k2", ..., comma-chained):
// per token k1 = -log r, k2 = (log r)^2 / 2, k3 = r - 1 - log r (log r clamped to [-20, 20]); judged per token,
// or per sequence on the sum, mean or max over its valid tokens. k1 keeps [log lower, log upper], the others
// <= upper. A token stays only if every criterion keeps it (a sequence criterion keeps or drops all its tokens).
struct RejectionCriterion {
  std::string name;              // as verl spells it, e.g. "seq_max_k2"
  int estimator = 1;             // 1, 2 or 3
  std::string scope = "token";   // token | seq_sum | seq_mean | seq_max
  double lower = 0, upper = 0;   // k1: ratio bounds (> 0); k2, k3: upper alone (lower unused)
};

struct RolloutCorrectionConfig {
  RolloutCorrLevel is_level = RolloutCorrLevel::kOff;  // rollout_is: null | token | sequence | geometric
  double is_threshold = 2.0;                           // rollout_is_threshold: upper bound (> 0)
  // rollout_is_threshold given as "lower_upper": masked IS (weights outside [lower, upper] are 0), not truncated.
  std::optional<double> is_threshold_lower;
  bool is_batch_normalize = false;                     // rollout_is_batch_normalize: weights to mean 1
  RolloutCorrLevel rs_level = RolloutCorrLevel::kOff;  // rollout_rs: null | token | sequence | geometric
  double rs_threshold = 2.0;                           // rollout_rs_threshold (required with rollout_rs)
  double rs_threshold_lower = 0.5;                     // rollout_rs_threshold_lower (null: 1 / rs_threshold)
  // rollout_rs as verl's divergence estimators (with rollout_rs_threshold "spec,spec", one per criterion or
  // one for all; a k1 spec "lower_upper" or an upper bound u meaning [1 / u, u]); rs_level is then kOff.
  std::vector<RejectionCriterion> rs_criteria;
  std::optional<double> token_veto_threshold;          // rollout_token_veto_threshold: reject a sequence
                                                       // holding any token ratio below it
  RolloutLossType loss_type = RolloutLossType::kPpoClip;  // loss_type

  bool rejects() const {
    return rs_level != RolloutCorrLevel::kOff || !rs_criteria.empty() || token_veto_threshold.has_value();
  }
};

// From the `algorithm` section (algorithm.rollout_correction.*: rollout_is, rollout_is_threshold,
// rollout_is_batch_normalize, rollout_rs, rollout_rs_threshold, rollout_rs_threshold_lower,
// rollout_token_veto_threshold, loss_type); errors name the key and the accepted values.
RolloutCorrectionConfig rollout_correction_config(const Config& algorithm);

// The same config through a worker call's meta (the actor applies it per micro-batch in bypass mode).
nlohmann::json to_json(const RolloutCorrectionConfig& config);
RolloutCorrectionConfig rollout_correction_config_from_json(const nlohmann::json& j);

struct RolloutCorrection {
  at::Tensor weights;    // [B, R] float, 0 at padding, detached; undefined when rollout_is is off
  at::Tensor keep_mask;  // [B, R] float, 1 kept / 0 rejected (padding 0); undefined when nothing rejects
  // rollout_corr/kl, k3_kl, log_ppl_diff (the mismatch); with weights rollout_is_{mean,std,min,max,
  // eff_sample_size,ratio_fraction_high,ratio_fraction_low} of the weights before truncation (and
  // rollout_is_batch_norm_factor); with rejection rollout_rs_{mean,std,min,max,eff_sample_size,
  // ratio_fraction_high,ratio_fraction_low,masked_fraction,seq_masked_fraction}, with the veto
  // rollout_is_veto_fraction and rollout_is_catastrophic_token_fraction, and rejected_fraction (the share
  // of valid tokens rejected by either). With rs_criteria, per criterion rollout_rs_<name>_{mean,max,
  // masked_fraction,seq_masked_fraction} (its statistic over valid tokens or sequences) and, over all,
  // rollout_rs_masked_fraction and rollout_rs_seq_masked_fraction.
  std::map<std::string, double> metrics;
};

// old_log_prob (the policy being trained), rollout_log_prob, response_mask: [B, R]. The log-ratio is
// clamped to [-20, 20] (per token, summed or averaged over the sequence) before exp, as verl does.
RolloutCorrection rollout_correction(const at::Tensor& old_log_prob, const at::Tensor& rollout_log_prob,
                                     const at::Tensor& response_mask, const RolloutCorrectionConfig& config);

// verl's compute_policy_loss_reinforce: L = -A w log_prob (w = 1 when `weights` is undefined), aggregated
// by agg_mode over response_mask; approx_kl = masked mean of rollout_log_prob - log_prob. No clip: the
// clip fractions are 0.
PolicyLossOutput reinforce_policy_loss(const at::Tensor& rollout_log_prob, const at::Tensor& log_prob,
                                       const at::Tensor& advantages, const at::Tensor& response_mask,
                                       LossAggMode agg_mode, std::optional<double> loss_scale_factor,
                                       const at::Tensor& weights = {});

}  // namespace hybridflow::algo
