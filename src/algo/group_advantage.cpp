// Estimators that compare the samples of one prompt with each other (GRPO, RLOO, REINFORCE++ with a group
// baseline, GPG; the optimal token baseline, per position).
#include <torch/torch.h>

#include <unordered_map>

#include "checks.h"
#include "hybridflow/algo/advantage.h"
#include "hybridflow/algo/masked.h"

namespace hybridflow::algo {
namespace {

struct Groups {
  at::Tensor dense_id;  // [B] int64 in [0, G)
  at::Tensor size;      // [G] float, rows per group
  int64_t count = 0;
};

// Group ids are arbitrary int64 labels; map them to 0..G-1 so per-group sums are one index_add.
Groups dense_groups(const at::Tensor& index, const at::TensorOptions& float_options) {
  auto ids = index.to(at::kLong).cpu().contiguous();
  const int64_t* data = ids.data_ptr<int64_t>();
  std::unordered_map<int64_t, int64_t> dense;
  auto dense_id = torch::empty({ids.size(0)}, torch::kLong);
  auto* out = dense_id.data_ptr<int64_t>();
  for (int64_t i = 0; i < ids.size(0); ++i) {
    auto it = dense.emplace(data[i], static_cast<int64_t>(dense.size())).first;
    out[i] = it->second;
  }
  Groups groups;
  groups.count = static_cast<int64_t>(dense.size());
  groups.dense_id = dense_id.to(float_options.device());
  groups.size = torch::zeros({groups.count}, float_options)
                    .index_add_(0, groups.dense_id, torch::ones({ids.size(0)}, float_options));
  return groups;
}

at::Tensor group_sum(const Groups& groups, const at::Tensor& per_row) {
  return torch::zeros({groups.count}, per_row.options()).index_add_(0, groups.dense_id, per_row);
}

struct Scores {
  at::Tensor score;  // [B] sequence score
  at::Tensor mask;   // [B, R] float
};

Scores sequence_scores(const AdvantageInput& in, const char* where) {
  detail::check_response_tensor(in.token_level_rewards, "token_level_rewards", where);
  detail::check_same_shape(in.response_mask, in.token_level_rewards, "response_mask", where);
  detail::check_per_sequence(in.index, in.token_level_rewards.size(0), "index (group ids)", where);
  auto rewards = detail::as_float(in.token_level_rewards);
  return {rewards.sum(-1), in.response_mask.to(rewards.scalar_type())};
}

AdvantageOutput broadcast(const at::Tensor& per_sequence, const at::Tensor& mask) {
  auto advantages = per_sequence.unsqueeze(-1) * mask;
  return {advantages, advantages.clone()};
}

// score minus the mean of its group; a group of one is compared with 0 (verl's id2mean of a single score).
at::Tensor minus_group_mean(const Scores& s, const at::Tensor& index) {
  auto groups = dense_groups(index, s.score.options());
  auto mean = group_sum(groups, s.score) / groups.size;
  mean = torch::where(groups.size < 1.5, torch::zeros_like(mean), mean);
  return s.score - mean.index_select(0, groups.dense_id);
}

}  // namespace

AdvantageOutput compute_grpo_advantage(const AdvantageInput& in) {
  torch::NoGradGuard no_grad;
  auto s = sequence_scores(in, "algo: grpo");
  auto groups = dense_groups(in.index, s.score.options());
  auto mean = group_sum(groups, s.score) / groups.size;
  auto centered = s.score - mean.index_select(0, groups.dense_id);
  // Unbiased std like torch.std; a group of one has no spread: mean 0, std 1 (verl).
  auto denom = (groups.size - 1).clamp_min(1);
  auto std = (group_sum(groups, centered * centered) / denom).sqrt();
  auto single = groups.size < 1.5;
  mean = torch::where(single, torch::zeros_like(mean), mean);
  std = torch::where(single, torch::ones_like(std), std);
  auto adv = s.score - mean.index_select(0, groups.dense_id);
  if (in.norm_adv_by_std_in_grpo) adv = adv / (std.index_select(0, groups.dense_id) + in.epsilon);
  return broadcast(adv, s.mask);
}

AdvantageOutput compute_rloo_advantage(const AdvantageInput& in) {
  torch::NoGradGuard no_grad;
  auto s = sequence_scores(in, "algo: rloo");
  auto groups = dense_groups(in.index, s.score.options());
  auto n = groups.size.index_select(0, groups.dense_id);
  auto others_mean = (group_sum(groups, s.score).index_select(0, groups.dense_id) - s.score) / (n - 1).clamp_min(1);
  auto adv = torch::where(n > 1.5, s.score - others_mean, s.score);
  return broadcast(adv, s.mask);
}

AdvantageOutput compute_reinforce_plus_plus_baseline_advantage(const AdvantageInput& in) {
  torch::NoGradGuard no_grad;
  auto s = sequence_scores(in, "algo: reinforce_plus_plus_baseline");
  auto per_token = minus_group_mean(s, in.index).unsqueeze(-1) * s.mask;
  auto advantages = masked_whiten(per_token, s.mask) * s.mask;
  return {advantages, advantages.clone()};
}

AdvantageOutput compute_gpg_advantage(const AdvantageInput& in) {
  torch::NoGradGuard no_grad;
  auto s = sequence_scores(in, "algo: gpg");
  const double rows = static_cast<double>(s.score.size(0));
  const double scored = std::max<double>(1.0, static_cast<double>((s.score != 0).sum().item<int64_t>()));
  return broadcast(minus_group_mean(s, in.index) * (rows / scored), s.mask);
}

AdvantageOutput compute_optimal_token_baseline_advantage(const AdvantageInput& in) {
  torch::NoGradGuard no_grad;
  constexpr const char* where = "algo: optimal_token_baseline";
  detail::check_response_tensor(in.token_level_rewards, "token_level_rewards", where);
  detail::check_same_shape(in.response_mask, in.token_level_rewards, "response_mask", where);
  detail::check_per_sequence(in.index, in.token_level_rewards.size(0), "index (group ids)", where);
  HF_CHECK(in.old_log_probs.defined() && in.sum_pi_squared.defined(), where, ": needs old_log_probs and ",
           "sum_pi_squared (actor_rollout_ref.actor.calculate_sum_pi_squared: the old log-prob pass computes them)");
  detail::check_same_shape(in.old_log_probs, in.token_level_rewards, "old_log_probs", where);
  detail::check_same_shape(in.sum_pi_squared, in.token_level_rewards, "sum_pi_squared", where);
  auto rewards = detail::as_float(in.token_level_rewards);
  auto mask = in.response_mask.to(rewards.scalar_type());
  // G_t: the reward from t to the end; W_t: the path's accumulated weight up to t.
  auto returns = (rewards * mask).flip({-1}).cumsum(-1).flip({-1}) * mask;
  auto step_weight = 1.0 - 2.0 * in.old_log_probs.to(rewards.scalar_type()).exp() + in.sum_pi_squared.to(rewards.scalar_type());
  if (in.rollout_is_weights.defined()) {
    detail::check_same_shape(in.rollout_is_weights, in.token_level_rewards, "rollout_is_weights", where);
    step_weight = step_weight * in.rollout_is_weights.to(rewards.scalar_type()).square();
  }
  auto path_weight = (step_weight * mask).cumsum(-1) * mask;
  auto groups = dense_groups(in.index, rewards.options());
  auto per_group = [&](const at::Tensor& rows) {
    return torch::zeros({groups.count, rows.size(1)}, rows.options()).index_add_(0, groups.dense_id, rows);
  };
  auto baseline = per_group(returns * path_weight) / (per_group(path_weight) + 1e-8);
  baseline = torch::where((groups.size < 1.5).unsqueeze(-1), torch::zeros_like(baseline), baseline);
  auto advantages = (returns - baseline.index_select(0, groups.dense_id)) * mask;
  return {advantages, returns};
}

}  // namespace hybridflow::algo
