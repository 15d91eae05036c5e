// The policy losses verl's registry gained after PPO and GSPO: CISPO, SAPO, GMPO (geo_mean), Clip-Cov,
// KL-Cov and DPPO (TV and KL). Formulas in losses.h; each masks like ppo_policy_loss (padding reaches neither loss nor gradient).
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>

#include "hybridflow/algo/losses.h"
#include "policy_loss_parts.h"

namespace hybridflow::algo {
namespace {

// (A_t - mean A)(logp_t - mean logp) over the valid tokens, detached, 0 at padding: the covariance whose
// largest values mark the tokens that drive entropy collapse (Clip-Cov / KL-Cov).
at::Tensor cov_losses_token_covariance(const at::Tensor& adv, const at::Tensor& lp, const at::Tensor& mask,
                                       const at::Tensor& valid) {
  torch::NoGradGuard no_grad;
  auto a = adv - masked_mean(adv, mask);
  auto l = lp.detach() - masked_mean(lp.detach(), mask);
  return detail::valid_only(a * l, valid);
}

// How many tokens a covariance method selects: max(1, floor(share * valid tokens)), as verl counts them.
int64_t cov_losses_selected_count(double share, int64_t n_valid) {
  return std::max<int64_t>(1, static_cast<int64_t>(share * static_cast<double>(n_valid)));
}

// Flat indices (into a contiguous [B, R]) of the positions where `which` is true.
at::Tensor cov_losses_flat_indices(const at::Tensor& which) { return torch::nonzero(which.reshape(-1)).reshape(-1); }

struct PolicyLossInputs {
  at::Tensor mask;   // response_mask in log_prob's dtype
  at::Tensor valid;  // mask != 0
  at::Tensor adv;    // detached advantages, 0 at padding
  at::Tensor log_ratio;  // log_prob - sg[old_log_prob], 0 at padding, unclamped
};

PolicyLossInputs policy_loss_inputs(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                                    const at::Tensor& advantages, const at::Tensor& response_mask,
                                    const PolicyLossConfig& config, const char* where) {
  detail::check_policy_inputs(old_log_prob, log_prob, advantages, response_mask, where);
  check_policy_loss_config(config);
  PolicyLossInputs in;
  in.mask = response_mask.to(log_prob.scalar_type());
  in.valid = in.mask != 0;
  in.adv = detail::valid_only(advantages.to(log_prob.scalar_type()).detach(), in.valid);
  in.log_ratio = detail::valid_only(log_prob - old_log_prob.detach(), in.valid);
  return in;
}

at::Tensor zero_fraction(const at::Tensor& like_scalar) { return torch::zeros_like(like_scalar); }

}  // namespace

void check_policy_loss_config(const PolicyLossConfig& c) {
  HF_CHECK(c.tau_pos > 0, "actor.tau_pos must be > 0 (SAPO's gate temperature), got ", c.tau_pos);
  HF_CHECK(c.tau_neg > 0, "actor.tau_neg must be > 0 (SAPO's gate temperature), got ", c.tau_neg);
  HF_CHECK(c.clip_cov_ratio > 0, "actor.policy_loss.clip_cov_ratio must be > 0, got ", c.clip_cov_ratio);
  HF_CHECK(c.clip_cov_lb < c.clip_cov_ub, "actor.policy_loss.clip_cov_lb (", c.clip_cov_lb,
           ") must be below actor.policy_loss.clip_cov_ub (", c.clip_cov_ub, ")");
  HF_CHECK(c.kl_cov_ratio > 0, "actor.policy_loss.kl_cov_ratio must be > 0, got ", c.kl_cov_ratio);
  HF_CHECK(c.ppo_kl_coef >= 0, "actor.policy_loss.ppo_kl_coef must be >= 0, got ", c.ppo_kl_coef);
}

PolicyLossOutput cispo_policy_loss(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                                   const at::Tensor& advantages, const at::Tensor& response_mask,
                                   const PolicyLossConfig& config, const at::Tensor& rollout_is_weights) {
  constexpr const char* kWhere = "algo: cispo_policy_loss";
  auto in = policy_loss_inputs(old_log_prob, log_prob, advantages, response_mask, config, kWhere);
  const auto [low, high] = detail::clip_range(config, kWhere, /*allow_no_lower_bound=*/true);
  auto log_ratio = in.log_ratio.clamp(-20.0, 20.0);
  // The weight carries no gradient: the update of every token is -A w d(log_prob), clipped or not.
  auto ratio = torch::exp(log_ratio).detach();
  auto weight = ratio.clamp(1.0 - low, 1.0 + high);
  auto lp = detail::valid_only(log_prob, in.valid);
  auto token_loss = detail::weighted(-weight * in.adv * lp, rollout_is_weights, in.valid, kWhere);

  PolicyLossOutput out;
  out.loss = agg_loss(token_loss, in.mask, config.agg_mode, config.loss_scale_factor);
  torch::NoGradGuard no_grad;
  out.clip_frac = masked_mean((ratio != weight).to(in.mask.scalar_type()), in.mask);
  out.clip_frac_lower = zero_fraction(out.clip_frac);
  out.approx_kl = masked_mean(-log_ratio, in.mask);
  return out;
}

PolicyLossOutput gpg_policy_loss(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                                 const at::Tensor& advantages, const at::Tensor& response_mask,
                                 const PolicyLossConfig& config, const at::Tensor& rollout_is_weights) {
  constexpr const char* kWhere = "algo: gpg_policy_loss";
  auto in = policy_loss_inputs(old_log_prob, log_prob, advantages, response_mask, config, kWhere);
  auto lp = detail::valid_only(log_prob, in.valid);
  auto token_loss = detail::weighted(-in.adv * lp, rollout_is_weights, in.valid, kWhere);

  PolicyLossOutput out;
  out.loss = agg_loss(token_loss, in.mask, config.agg_mode, config.loss_scale_factor);
  torch::NoGradGuard no_grad;
  out.clip_frac = masked_mean(torch::zeros_like(in.mask), in.mask);
  out.clip_frac_lower = zero_fraction(out.clip_frac);
  out.approx_kl = masked_mean(-in.log_ratio, in.mask);
  return out;
}

PolicyLossOutput sapo_policy_loss(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                                  const at::Tensor& advantages, const at::Tensor& response_mask,
                                  const PolicyLossConfig& config, const at::Tensor& rollout_is_weights) {
  constexpr const char* kWhere = "algo: sapo_policy_loss";
  auto in = policy_loss_inputs(old_log_prob, log_prob, advantages, response_mask, config, kWhere);
  auto log_ratio = in.log_ratio.clamp(-20.0, 20.0);
  auto ratio = torch::exp(log_ratio);
  auto tau = torch::where(in.adv > 0, torch::full_like(ratio, config.tau_pos), torch::full_like(ratio, config.tau_neg));
  // A soft trust region: the gate's slope is 1 at r = 1 and fades smoothly as r leaves it.
  auto gate = torch::sigmoid(tau * (ratio - 1.0)) * (4.0 / tau);
  auto token_loss = detail::weighted(-gate * in.adv, rollout_is_weights, in.valid, kWhere);

  PolicyLossOutput out;
  out.loss = agg_loss(token_loss, in.mask, LossAggMode::kSeqMeanTokenMean);
  torch::NoGradGuard no_grad;
  out.approx_kl = masked_mean(-log_ratio, in.mask);
  out.clip_frac = zero_fraction(out.approx_kl);
  out.clip_frac_lower = zero_fraction(out.approx_kl);
  return out;
}

PolicyLossOutput geo_mean_policy_loss(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                                      const at::Tensor& advantages, const at::Tensor& response_mask,
                                      const PolicyLossConfig& config, const at::Tensor& rollout_is_weights) {
  constexpr const char* kWhere = "algo: geo_mean_policy_loss";
  auto in = policy_loss_inputs(old_log_prob, log_prob, advantages, response_mask, config, kWhere);
  const auto [low, high] = detail::clip_range(config, kWhere);
  const auto& d = in.log_ratio;
  auto sign = torch::sign(in.adv);
  auto d_clipped = d.clamp(-low, high);
  // Clip only the side that would raise the objective: for A > 0 d may not exceed high, for A < 0 not fall
  // below -low.
  auto d_pessimistic = sign * torch::min(sign * d, sign * d_clipped);
  auto length = in.mask.sum(-1) + 1e-8;
  auto seq_ratio = torch::exp(masked_sum(d_pessimistic, in.mask, -1) / length);
  auto seq_adv = masked_sum(in.adv, in.mask, -1) / length;
  auto row_loss = -seq_adv * seq_ratio;
  if (rollout_is_weights.defined()) {
    detail::check_same_shape(rollout_is_weights, log_prob, "rollout_is_weights", kWhere);
    auto w = detail::valid_only(rollout_is_weights.to(log_prob.scalar_type()).detach(), in.valid);
    row_loss = row_loss * torch::exp(masked_sum(torch::log(w + 1e-10), in.mask, -1) / length);
  }
  // The mean over the rows with tokens: the seq-mean the micro-batch weighting assumes.
  auto rows = (in.mask.sum(-1) > 0).to(row_loss.scalar_type());
  PolicyLossOutput out;
  out.loss = (detail::valid_only(row_loss, rows > 0)).sum() / rows.sum().clamp_min(1.0);
  torch::NoGradGuard no_grad;
  auto clipped = d != d_clipped;
  out.clip_frac = masked_mean((clipped & (in.adv > 0)).to(in.mask.scalar_type()), in.mask);
  out.clip_frac_lower = masked_mean((clipped & (in.adv < 0)).to(in.mask.scalar_type()), in.mask);
  out.approx_kl = masked_mean(-d, in.mask);
  return out;
}

PolicyLossOutput clip_cov_policy_loss(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                                      const at::Tensor& advantages, const at::Tensor& response_mask,
                                      const PolicyLossConfig& config, const at::Tensor& rollout_is_weights) {
  constexpr const char* kWhere = "algo: clip_cov_policy_loss";
  auto in = policy_loss_inputs(old_log_prob, log_prob, advantages, response_mask, config, kWhere);
  const auto [low, high] = detail::clip_range(config, kWhere);
  auto ratio = torch::exp(in.log_ratio);
  auto loss_unclipped = -in.adv * ratio;
  auto loss_clipped = -in.adv * ratio.clamp(1.0 - low, 1.0 + high);
  auto clipped = (loss_clipped > loss_unclipped) & in.valid;

  auto keep = torch::ones(in.mask.sizes(), in.mask.options());  // contiguous, for view(-1)
  const int64_t n_valid = in.valid.sum().item<int64_t>();
  if (n_valid > 0) {
    auto cov = cov_losses_token_covariance(in.adv, log_prob, in.mask, in.valid);
    auto candidates = in.valid & ~clipped & (cov > config.clip_cov_lb) & (cov < config.clip_cov_ub);
    auto idx = cov_losses_flat_indices(candidates);
    const int64_t take = cov_losses_selected_count(config.clip_cov_ratio, n_valid);
    if (idx.numel() > take) {
      // A generator of its own, seeded from the micro-batch: the draw does not depend on what else consumed
      // torch's global one, so a run, its resume and a replay pick the same tokens.
      auto gen = at::make_generator<at::CPUGeneratorImpl>(
          static_cast<uint64_t>(0x9e3779b97f4a7c15ULL ^ (static_cast<uint64_t>(n_valid) << 20) ^
                                static_cast<uint64_t>(idx.numel())));
      auto pick = torch::randperm(idx.numel(), gen, torch::TensorOptions().dtype(torch::kLong)).slice(0, 0, take);
      idx = idx.index_select(0, pick.to(idx.device()));
    }
    keep.view(-1).index_fill_(0, idx, 0.0);
  }
  auto token_loss = detail::weighted(torch::max(loss_unclipped, loss_clipped) * keep, rollout_is_weights, in.valid, kWhere);

  PolicyLossOutput out;
  out.loss = agg_loss(token_loss, in.mask, config.agg_mode, config.loss_scale_factor);
  torch::NoGradGuard no_grad;
  out.clip_frac = masked_mean(clipped.to(in.mask.scalar_type()), in.mask);
  out.clip_frac_lower = zero_fraction(out.clip_frac);
  out.cov_frac = masked_mean((keep == 0).to(in.mask.scalar_type()), in.mask);
  out.approx_kl = masked_mean(-in.log_ratio, in.mask);
  return out;
}

PolicyLossOutput kl_cov_policy_loss(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                                    const at::Tensor& advantages, const at::Tensor& response_mask,
                                    const PolicyLossConfig& config, const at::Tensor& rollout_is_weights) {
  constexpr const char* kWhere = "algo: kl_cov_policy_loss";
  auto in = policy_loss_inputs(old_log_prob, log_prob, advantages, response_mask, config, kWhere);
  auto ratio = torch::exp(in.log_ratio);
  auto loss_plain = -in.adv * ratio;
  auto loss_penalised = loss_plain + config.ppo_kl_coef * in.log_ratio.abs();

  auto selected = torch::zeros(in.valid.sizes(), in.valid.options());  // contiguous, for view(-1)
  const int64_t n_valid = in.valid.sum().item<int64_t>();
  if (n_valid > 0) {
    auto cov = cov_losses_token_covariance(in.adv, log_prob, in.mask, in.valid);
    auto valid_idx = cov_losses_flat_indices(in.valid);
    const int64_t take = cov_losses_selected_count(config.kl_cov_ratio, n_valid);
    auto top = std::get<1>(torch::topk(cov.reshape(-1).index_select(0, valid_idx), std::min(take, n_valid)));
    selected.view(-1).index_fill_(0, valid_idx.index_select(0, top), true);
  }
  auto token_loss = detail::weighted(torch::where(selected, loss_penalised, loss_plain), rollout_is_weights, in.valid, kWhere);

  PolicyLossOutput out;
  out.loss = agg_loss(token_loss, in.mask, config.agg_mode, config.loss_scale_factor);
  torch::NoGradGuard no_grad;
  out.approx_kl = masked_mean(-in.log_ratio, in.mask);
  out.clip_frac = zero_fraction(out.approx_kl);
  out.clip_frac_lower = zero_fraction(out.approx_kl);
  out.cov_frac = masked_mean(selected.to(in.mask.scalar_type()), in.mask);
  return out;
}

PolicyLossOutput dppo_policy_loss(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                                  const at::Tensor& advantages, const at::Tensor& response_mask,
                                  const PolicyLossConfig& config, const at::Tensor& rollout_is_weights) {
  const bool kl = config.loss_mode == PolicyLossMode::kDppoKl;
  const char* where = kl ? "algo: dppo_policy_loss (dppo_kl)" : "algo: dppo_policy_loss (dppo_tv)";
  HF_CHECK(kl || config.loss_mode == PolicyLossMode::kDppoTv, where, ": loss_mode must be dppo_tv or dppo_kl, got ",
           to_string(config.loss_mode));
  auto in = policy_loss_inputs(old_log_prob, log_prob, advantages, response_mask, config, where);
  const auto [low, high] = detail::clip_range(config, where);
  HF_CHECK(config.clip_ratio_c > 1, where, ": clip_ratio_c (the ratio's truncation) must be > 1, got ",
           config.clip_ratio_c);
  auto log_ratio = in.log_ratio.clamp(-20.0, 20.0);
  auto ratio = torch::exp(log_ratio).detach();
  auto weight = ratio.clamp_max(config.clip_ratio_c);
  auto lp = detail::valid_only(log_prob, in.valid);

  at::Tensor keep;
  {
    // The trust region is decided on the token's probability itself, not on the ratio.
    torch::NoGradGuard no_grad;
    auto p = torch::exp(lp);
    auto old_lp = detail::valid_only(old_log_prob.detach(), in.valid);
    auto q = torch::exp(old_lp);
    if (kl) {
      // The KL between the Bernoulli distributions "this token or not" under the old and the new policy.
      auto divergence = q * (old_lp - lp) + (1.0 - q) * torch::log((1.0 - q + 1e-8) / (1.0 - p + 1e-8));
      keep = torch::where(in.adv > 0, (divergence <= high) | (p <= q), (divergence <= low) | (p >= q));
    } else {
      keep = torch::where(in.adv > 0, p - q <= high, p - q >= -low);
    }
    keep = (keep & in.valid).to(in.mask.scalar_type());
  }
  auto token_loss = detail::weighted(-in.adv * weight * lp * keep, rollout_is_weights, in.valid, where);

  PolicyLossOutput out;
  out.loss = agg_loss(token_loss, in.mask, config.agg_mode, config.loss_scale_factor);
  torch::NoGradGuard no_grad;
  out.clip_frac = masked_mean(1.0 - keep, in.mask);
  out.clip_frac_lower = masked_mean((ratio > config.clip_ratio_c).to(in.mask.scalar_type()) * keep, in.mask);
  out.approx_kl = masked_mean(-log_ratio, in.mask);
  return out;
}

}  // namespace hybridflow::algo
