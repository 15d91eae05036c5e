#include "hybridflow/algo/losses.h"

#include <torch/torch.h>

#include "checks.h"
#include "policy_loss_parts.h"

namespace hybridflow::algo {

using detail::check_policy_inputs;
using detail::clip_range;
using detail::valid_only;
using detail::weighted;

namespace {

struct PolicyLossModeName {
  PolicyLossMode mode;
  const char* name;
};
constexpr PolicyLossModeName kPolicyLossModeNames[] = {
    {PolicyLossMode::kVanilla, "vanilla"},  {PolicyLossMode::kGspo, "gspo"},
    {PolicyLossMode::kCispo, "cispo"},      {PolicyLossMode::kSapo, "sapo"},
    {PolicyLossMode::kGeoMean, "geo_mean"}, {PolicyLossMode::kClipCov, "clip_cov"},
    {PolicyLossMode::kKlCov, "kl_cov"},     {PolicyLossMode::kDppoTv, "dppo_tv"},
    {PolicyLossMode::kDppoKl, "dppo_kl"},   {PolicyLossMode::kGpg, "gpg"}};

}  // namespace

PolicyLossMode parse_policy_loss_mode(const std::string& name) {
  for (const auto& m : kPolicyLossModeNames)
    if (name == m.name) return m.mode;
  HF_FAIL("algo: unknown policy_loss.loss_mode '", name,
          "' (expected vanilla, gspo, cispo, sapo, geo_mean, clip_cov, kl_cov, dppo_tv, dppo_kl or gpg)");
}

std::string to_string(PolicyLossMode mode) {
  for (const auto& m : kPolicyLossModeNames)
    if (mode == m.mode) return m.name;
  HF_FAIL("algo: unhandled policy loss mode ", static_cast<int>(mode));
}

PolicyLossOutput ppo_policy_loss(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                                 const at::Tensor& advantages, const at::Tensor& response_mask,
                                 const PolicyLossConfig& config, const at::Tensor& rollout_is_weights) {
  constexpr const char* kWhere = "algo: ppo_policy_loss";
  check_policy_inputs(old_log_prob, log_prob, advantages, response_mask, kWhere);
  const auto [low, high] = clip_range(config, kWhere);
  HF_CHECK(config.clip_ratio_c > 1, kWhere, ": clip_ratio_c must be > 1 (dual clip lower bound), got ",
           config.clip_ratio_c);

  auto mask = response_mask.to(log_prob.scalar_type());
  auto valid = mask != 0;
  auto adv = valid_only(advantages.to(log_prob.scalar_type()).detach(), valid);
  auto log_ratio = valid_only(log_prob - old_log_prob.detach(), valid).clamp(-20.0, 20.0);
  auto ratio = torch::exp(log_ratio);

  auto loss_unclipped = -adv * ratio;
  auto loss_clipped = -adv * ratio.clamp(1.0 - low, 1.0 + high);
  auto clip_loss = torch::max(loss_unclipped, loss_clipped);
  // Dual clip: with A < 0 a huge ratio would make the loss unbounded; cap it at -A * c.
  auto dual_bound = -adv * config.clip_ratio_c;
  auto negative = adv < 0;
  auto token_loss =
      weighted(torch::where(negative, torch::min(clip_loss, dual_bound), clip_loss), rollout_is_weights, valid, kWhere);

  PolicyLossOutput out;
  out.loss = agg_loss(token_loss, mask, config.agg_mode, config.loss_scale_factor);
  torch::NoGradGuard no_grad;
  out.clip_frac = masked_mean((loss_clipped > loss_unclipped).to(mask.scalar_type()), mask);
  out.clip_frac_lower = masked_mean(((clip_loss > dual_bound) & negative).to(mask.scalar_type()), mask);
  out.approx_kl = masked_mean(-log_ratio, mask);
  return out;
}

PolicyLossOutput gspo_policy_loss(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                                  const at::Tensor& advantages, const at::Tensor& response_mask,
                                  const PolicyLossConfig& config, const at::Tensor& rollout_is_weights) {
  constexpr const char* kWhere = "algo: gspo_policy_loss";
  check_policy_inputs(old_log_prob, log_prob, advantages, response_mask, kWhere);
  const auto [low, high] = clip_range(config, kWhere);

  auto mask = response_mask.to(log_prob.scalar_type());
  auto valid = mask != 0;
  auto adv = valid_only(advantages.to(log_prob.scalar_type()).detach(), valid);
  auto lp = valid_only(log_prob, valid);
  auto log_ratio = lp - valid_only(old_log_prob.detach(), valid);
  // k_i: the row's mean log-ratio (verl clamps the length to >= 1 so an empty row gives 0).
  auto seq_len = mask.sum(-1).clamp_min(1.0);
  auto seq_log_ratio = masked_sum(log_ratio, mask, -1) / seq_len;
  // The value is exp(k_i); the gradient flows only through each token's own log-prob.
  auto log_seq_ratio = (lp - lp.detach() + seq_log_ratio.detach().unsqueeze(-1)).clamp_max(10.0);
  auto ratio = torch::exp(log_seq_ratio);

  auto loss_unclipped = -adv * ratio;
  auto loss_clipped = -adv * ratio.clamp(1.0 - low, 1.0 + high);
  auto token_loss = weighted(torch::max(loss_unclipped, loss_clipped), rollout_is_weights, valid, kWhere);

  PolicyLossOutput out;
  out.loss = agg_loss(token_loss, mask, LossAggMode::kSeqMeanTokenMean);
  torch::NoGradGuard no_grad;
  out.clip_frac = masked_mean((loss_clipped > loss_unclipped).to(mask.scalar_type()), mask);
  out.clip_frac_lower = torch::zeros_like(out.clip_frac);
  out.approx_kl = masked_mean(-log_ratio, mask);
  return out;
}

PolicyLossOutput policy_loss(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                             const at::Tensor& advantages, const at::Tensor& response_mask,
                             const PolicyLossConfig& config, const at::Tensor& rollout_is_weights) {
  const auto& w = rollout_is_weights;
  switch (config.loss_mode) {
    case PolicyLossMode::kVanilla: return ppo_policy_loss(old_log_prob, log_prob, advantages, response_mask, config, w);
    case PolicyLossMode::kGspo: return gspo_policy_loss(old_log_prob, log_prob, advantages, response_mask, config, w);
    case PolicyLossMode::kCispo: return cispo_policy_loss(old_log_prob, log_prob, advantages, response_mask, config, w);
    case PolicyLossMode::kSapo: return sapo_policy_loss(old_log_prob, log_prob, advantages, response_mask, config, w);
    case PolicyLossMode::kGeoMean:
      return geo_mean_policy_loss(old_log_prob, log_prob, advantages, response_mask, config, w);
    case PolicyLossMode::kClipCov:
      return clip_cov_policy_loss(old_log_prob, log_prob, advantages, response_mask, config, w);
    case PolicyLossMode::kKlCov: return kl_cov_policy_loss(old_log_prob, log_prob, advantages, response_mask, config, w);
    case PolicyLossMode::kDppoTv:
    case PolicyLossMode::kDppoKl: return dppo_policy_loss(old_log_prob, log_prob, advantages, response_mask, config, w);
    case PolicyLossMode::kGpg: return gpg_policy_loss(old_log_prob, log_prob, advantages, response_mask, config, w);
  }
  HF_FAIL("algo: unhandled policy loss mode ", static_cast<int>(config.loss_mode));
}

ValueLossOutput clipped_value_loss(const at::Tensor& vpreds, const at::Tensor& old_values, const at::Tensor& returns,
                                   const at::Tensor& response_mask, double cliprange_value, LossAggMode agg_mode,
                                   std::optional<double> loss_scale_factor) {
  constexpr const char* kWhere = "algo: clipped_value_loss";
  detail::check_response_tensor(vpreds, "vpreds", kWhere);
  detail::check_same_shape(old_values, vpreds, "old values", kWhere);
  detail::check_same_shape(returns, vpreds, "returns", kWhere);
  detail::check_same_shape(response_mask, vpreds, "response_mask", kWhere);
  HF_CHECK(cliprange_value >= 0, kWhere, ": cliprange_value must be >= 0, got ", cliprange_value);
  auto mask = response_mask.to(vpreds.scalar_type());
  auto old = old_values.detach();
  auto target = returns.detach();
  auto vclipped = torch::max(torch::min(vpreds, old + cliprange_value), old - cliprange_value);
  auto loss1 = (vpreds - target).pow(2);
  auto loss2 = (vclipped - target).pow(2);
  ValueLossOutput out;
  out.loss = 0.5 * agg_loss(torch::max(loss1, loss2), mask, agg_mode, loss_scale_factor);
  torch::NoGradGuard no_grad;
  out.clip_frac = masked_mean((loss2 > loss1).to(mask.scalar_type()), mask);
  return out;
}

at::Tensor entropy_from_logits(const at::Tensor& logits) {
  auto probs = torch::softmax(logits, -1);
  return torch::logsumexp(logits, -1) - (probs * logits).sum(-1);
}

at::Tensor entropy_loss(const at::Tensor& logits, const at::Tensor& response_mask, LossAggMode agg_mode) {
  HF_CHECK(logits.dim() == 3, "algo: entropy_loss expects logits [B, R, V], got shape ", logits.sizes());
  auto entropy = entropy_from_logits(logits);
  detail::check_same_shape(response_mask, entropy, "response_mask", "algo: entropy_loss");
  return agg_loss(entropy, response_mask, agg_mode);
}

}  // namespace hybridflow::algo
