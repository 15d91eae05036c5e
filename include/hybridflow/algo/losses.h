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
  kGspo,     // "gspo": one sequence-level ratio per row (gspo_policy_loss)
  kCispo,    // "cispo": clipped, stop-gradient importance weight times log-prob (cispo_policy_loss)
  kSapo,     // "sapo": sigmoid gate of the ratio instead of a hard clip (sapo_policy_loss)
  kGeoMean,  // "geo_mean" (GMPO): geometric mean of the clipped token ratios per row (geo_mean_policy_loss)
  kClipCov,  // "clip_cov": PPO clip, plus zero loss on a few high-covariance tokens (clip_cov_policy_loss)
  kKlCov,    // "kl_cov": unclipped ratio, plus a |log r| penalty on the top-covariance tokens (kl_cov_policy_loss)
  kDppoTv,   // "dppo_tv": DPPO, tokens masked by the probability change (dppo_policy_loss)
  kDppoKl,   // "dppo_kl": DPPO, tokens masked by the binary KL of the token's probability (dppo_policy_loss)
  kGpg       // "gpg": plain policy gradient, -A log_prob, no ratio (gpg_policy_loss)
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
  // SAPO's gate temperatures (actor.tau_pos for A > 0, actor.tau_neg otherwise), both > 0.
  double tau_pos = 1.0;
  double tau_neg = 1.05;
  // Clip-Cov (actor.policy_loss.*): the share of valid tokens to drop, and the open covariance band
  // (clip_cov_lb, clip_cov_ub) they are drawn from.
  double clip_cov_ratio = 0.0002;
  double clip_cov_lb = 1.0;
  double clip_cov_ub = 5.0;
  // KL-Cov (actor.policy_loss.*): the share of valid tokens penalised, and the penalty's coefficient.
  double kl_cov_ratio = 0.0002;
  double ppo_kl_coef = 0.1;

  // The aggregation the policy loss really uses: GSPO, SAPO and GMPO always average per sequence
  // (seq-mean-token-mean), whatever agg_mode says, as verl's compute_policy_loss_{gspo,sapo,geo_mean} do.
  LossAggMode policy_agg_mode() const {
    switch (loss_mode) {
      case PolicyLossMode::kGspo:
      case PolicyLossMode::kSapo:
      case PolicyLossMode::kGeoMean: return LossAggMode::kSeqMeanTokenMean;
      default: return agg_mode;
    }
  }
};

// Checks the parameters of the newer losses (tau_pos, tau_neg, clip_cov_*, kl_cov_ratio, ppo_kl_coef),
// throwing with the key's name (actor.tau_pos, actor.policy_loss.clip_cov_ratio, ...).
void check_policy_loss_config(const PolicyLossConfig& config);

struct PolicyLossOutput {
  at::Tensor loss;             // scalar, differentiable w.r.t. log_prob
  at::Tensor clip_frac;        // fraction of valid tokens where the ratio clip was active
  at::Tensor approx_kl;        // masked mean of old_log_prob - log_prob
  at::Tensor clip_frac_lower;  // fraction of valid tokens where the dual clip (A < 0) was active
  // clip_cov / kl_cov only (undefined otherwise): fraction of valid tokens the covariance selected.
  at::Tensor cov_frac;
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

// CISPO (arXiv 2506.13585), verl's compute_policy_loss_cispo: w = sg[clip(r, 1 - low, 1 + high)] with r as in
// ppo_policy_loss; L = -w A log_prob, aggregated by config.agg_mode. Every valid token keeps a gradient
// (-w A per unit of its log-prob), clipped ones included: the clip bounds the weight, not the update.
// clip_low may be >= 1 (no lower bound, as the paper runs it). clip_frac: share of tokens with r != w.
PolicyLossOutput cispo_policy_loss(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                                   const at::Tensor& advantages, const at::Tensor& response_mask,
                                   const PolicyLossConfig& config = {}, const at::Tensor& rollout_is_weights = {});

// GPG (arXiv 2504.02546), verl's compute_policy_loss_gpg: L = -A log_prob per valid token (times the rollout
// importance weight), aggregated by agg_mode; no ratio, so nothing is clipped (clip_frac 0) and approx_kl is the
// mean of old - new log-prob, logged as the other modes log it.
PolicyLossOutput gpg_policy_loss(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                                 const at::Tensor& advantages, const at::Tensor& response_mask,
                                 const PolicyLossConfig& config, const at::Tensor& rollout_is_weights = {});

// SAPO (arXiv 2511.20347), verl's compute_policy_loss_sapo: L = -A g(r, tau), g(r, tau) = sigmoid(tau (r - 1)) 4 / tau,
// tau = tau_pos where A > 0 and tau_neg elsewhere; r as in ppo_policy_loss; aggregated seq-mean-token-mean.
// No hard clip: clip_frac and clip_frac_lower are 0.
PolicyLossOutput sapo_policy_loss(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                                  const at::Tensor& advantages, const at::Tensor& response_mask,
                                  const PolicyLossConfig& config = {}, const at::Tensor& rollout_is_weights = {});

// GMPO (arXiv 2507.20673), verl's compute_policy_loss_geo_mean: d = log_prob - old_log_prob (unclamped);
// with s = sign(A), d' = s min(s d, s clip(d, -low, high)) (the log-ratio clipped only on the side that would
// raise the objective); per row, rho_i = exp(sum_t m d' / (n_i + 1e-8)), a_i = sum_t m A / (n_i + 1e-8),
// L_i = -a_i rho_i; the loss is the mean of L_i over the rows with tokens. Rollout weights enter as their
// per-row geometric mean. clip_frac / clip_frac_lower: share of tokens with d clipped and A > 0 / A < 0.
PolicyLossOutput geo_mean_policy_loss(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                                      const at::Tensor& advantages, const at::Tensor& response_mask,
                                      const PolicyLossConfig& config = {}, const at::Tensor& rollout_is_weights = {});

// Clip-Cov (arXiv 2505.22617), verl's compute_policy_loss_clip_cov: r = exp(log_prob - old_log_prob)
// (unclamped), L = max(-A r, -A clip(r, 1 - low, 1 + high)), no dual clip. cov_t = (A_t - mean A)(logp_t - mean logp)
// over the valid tokens; among the valid, unclipped tokens with clip_cov_lb < cov < clip_cov_ub,
// max(1, floor(clip_cov_ratio n_valid)) drawn at random (a generator seeded from the counts) get L = 0 and no gradient; all
// of them when fewer qualify. Aggregated by config.agg_mode. cov_frac: the share dropped.
PolicyLossOutput clip_cov_policy_loss(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                                      const at::Tensor& advantages, const at::Tensor& response_mask,
                                      const PolicyLossConfig& config = {}, const at::Tensor& rollout_is_weights = {});

// KL-Cov (arXiv 2505.22617), verl's compute_policy_loss_kl_cov: L = -A r (no clip) with r unclamped; on the
// max(1, floor(kl_cov_ratio n_valid)) valid tokens of largest covariance (as clip_cov) L = -A r + ppo_kl_coef |log r|.
// Aggregated by config.agg_mode. cov_frac: the share penalised; clip_frac and clip_frac_lower are 0.
PolicyLossOutput kl_cov_policy_loss(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                                    const at::Tensor& advantages, const at::Tensor& response_mask,
                                    const PolicyLossConfig& config = {}, const at::Tensor& rollout_is_weights = {});

// DPPO (arXiv 2602.04879), verl's compute_policy_loss_dppo_tv / _kl (config.loss_mode picks which):
// L = -A sg[min(r, clip_ratio_c)] log_prob M, r as in ppo_policy_loss, aggregated by config.agg_mode.
// clip_ratio_low/high are divergence thresholds here, not ratio clips. With p = e^log_prob, q = e^old_log_prob:
// TV: M = (p - q <= high) where A > 0, (p - q >= -low) elsewhere.
// KL: D = q log(q / p) + (1 - q) log((1 - q + 1e-8) / (1 - p + 1e-8)); M = (D <= high or p <= q) where A > 0,
// (D <= low or p >= q) elsewhere. Masked tokens have no gradient; the weight never has one.
// clip_frac: share of valid tokens masked; clip_frac_lower: share kept with r > clip_ratio_c (truncated).
PolicyLossOutput dppo_policy_loss(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                                  const at::Tensor& advantages, const at::Tensor& response_mask,
                                  const PolicyLossConfig& config, const at::Tensor& rollout_is_weights = {});

// The loss of config.loss_mode.
PolicyLossOutput policy_loss(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                             const at::Tensor& advantages, const at::Tensor& response_mask,
                             const PolicyLossConfig& config = {}, const at::Tensor& rollout_is_weights = {});

struct ValueLossOutput {
  at::Tensor loss;       // scalar 0.5 * agg(max((v - R)^2, (clip(v, V_old +- c) - R)^2))
  at::Tensor clip_frac;  // fraction of valid tokens where the clipped term was larger
};

// loss_scale_factor: seq-mean-token-sum-norm's constant length (unset: the width of response_mask).
ValueLossOutput clipped_value_loss(const at::Tensor& vpreds, const at::Tensor& old_values, const at::Tensor& returns,
                                   const at::Tensor& response_mask, double cliprange_value,
                                   LossAggMode agg_mode = LossAggMode::kTokenMean,
                                   std::optional<double> loss_scale_factor = std::nullopt);

// Entropy of the categorical distribution of logits [..., V] over its last dim: logsumexp(z) - sum softmax(z) z.
at::Tensor entropy_from_logits(const at::Tensor& logits);

// Aggregated token entropy of logits [B, R, V]; the actor loss subtracts entropy_coeff times this.
at::Tensor entropy_loss(const at::Tensor& logits, const at::Tensor& response_mask,
                        LossAggMode agg_mode = LossAggMode::kTokenMean);

}  // namespace hybridflow::algo
