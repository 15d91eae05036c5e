// Estimators that compare the samples of one prompt with each other (GRPO, RLOO, REINFORCE++ with a group
// baseline, GPG; the optimal token baseline, per position).
#include <torch/torch.h>

#include <algorithm>
#include <unordered_map>
#include <vector>

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

namespace {

// The optimal token baseline's per-token parts (verl's): G, the reward-to-go over valid tokens, and W, the
// path weight: the running sum of 1 - 2 p + sum p^2 (times the importance weight squared) over valid tokens.
struct TokenBaselineParts {
  at::Tensor mask, returns, path_weight;  // [B, R]
};

TokenBaselineParts token_baseline_parts(const AdvantageInput& in, const char* where) {
  detail::check_response_tensor(in.token_level_rewards, "token_level_rewards", where);
  detail::check_same_shape(in.response_mask, in.token_level_rewards, "response_mask", where);
  detail::check_per_sequence(in.index, in.token_level_rewards.size(0), "index (group ids)", where);
  HF_CHECK(in.old_log_probs.defined() && in.sum_pi_squared.defined(), where, ": needs old_log_probs and ",
           "sum_pi_squared (actor_rollout_ref.actor.calculate_sum_pi_squared: the old log-prob pass computes them)");
  detail::check_same_shape(in.old_log_probs, in.token_level_rewards, "old_log_probs", where);
  detail::check_same_shape(in.sum_pi_squared, in.token_level_rewards, "sum_pi_squared", where);
  auto rewards = detail::as_float(in.token_level_rewards);
  const auto type = rewards.scalar_type();
  TokenBaselineParts p;
  p.mask = in.response_mask.to(type);
  p.returns = (rewards * p.mask).flip({-1}).cumsum(-1).flip({-1}) * p.mask;
  auto step_weight = 1.0 - 2.0 * in.old_log_probs.to(type).exp() + in.sum_pi_squared.to(type);
  if (in.rollout_is_weights.defined()) {
    detail::check_same_shape(in.rollout_is_weights, in.token_level_rewards, "rollout_is_weights", where);
    step_weight = step_weight * in.rollout_is_weights.to(type).square();
  }
  p.path_weight = (step_weight * p.mask).cumsum(-1) * p.mask;
  return p;
}

// Per group g and column t: sum_i G_it W_it / (sum_i W_it + 1e-8), 0 for groups of fewer than two `members`.
at::Tensor weighted_group_baseline(const Groups& groups, const at::Tensor& returns, const at::Tensor& path_weight,
                                   const at::Tensor& members) {
  auto per_group = [&](const at::Tensor& rows) {
    return torch::zeros({groups.count, rows.size(1)}, rows.options()).index_add_(0, groups.dense_id, rows);
  };
  auto baseline = per_group(returns * path_weight) / (per_group(path_weight) + 1e-8);
  return torch::where((members < 1.5).unsqueeze(-1), torch::zeros_like(baseline), baseline);
}

}  // namespace

AdvantageOutput compute_optimal_token_baseline_advantage(const AdvantageInput& in) {
  torch::NoGradGuard no_grad;
  const TokenBaselineParts p = token_baseline_parts(in, "algo: optimal_token_baseline");
  auto groups = dense_groups(in.index, p.returns.options());
  auto baseline = weighted_group_baseline(groups, p.returns, p.path_weight, groups.size);
  return {(p.returns - baseline.index_select(0, groups.dense_id)) * p.mask, p.returns};
}

AdvantageOutput compute_tir_optimal_token_baseline_advantage(const AdvantageInput& in) {
  torch::NoGradGuard no_grad;
  const TokenBaselineParts p = token_baseline_parts(in, "algo: tir_optimal_token_baseline");
  // Each valid token's place among its row's valid tokens; the rows' parts packed to the left by it.
  auto valid = p.mask > 0.5;
  auto place = (valid.to(torch::kLong).cumsum(-1) - 1).clamp_min(0);
  auto packed = [&](const at::Tensor& t) { return torch::zeros_like(t).scatter_add_(1, place, t * p.mask); };
  auto returns = packed(p.returns), path_weight = packed(p.path_weight);
  auto groups = dense_groups(in.index, returns.options());
  auto lengths = valid.sum(-1);  // [B]
  auto members = group_sum(groups, (lengths > 0).to(returns.scalar_type()));
  auto baseline = weighted_group_baseline(groups, returns, path_weight, members).index_select(0, groups.dense_id);
  // A group's one longest row past the second longest compares with nothing: baseline 0 there.
  const auto len = lengths.cpu().contiguous();
  const auto ids = groups.dense_id.cpu().contiguous();
  std::vector<std::vector<int64_t>> rows_of(static_cast<size_t>(groups.count));
  for (int64_t i = 0; i < len.size(0); ++i)
    if (len.data_ptr<int64_t>()[i] > 0) rows_of[static_cast<size_t>(ids.data_ptr<int64_t>()[i])].push_back(i);
  for (const auto& rows : rows_of) {
    if (rows.size() < 2) continue;
    std::vector<int64_t> sorted;
    for (int64_t i : rows) sorted.push_back(len.data_ptr<int64_t>()[i]);
    std::sort(sorted.begin(), sorted.end());
    const int64_t longest = sorted.back(), second = sorted[sorted.size() - 2];
    if (longest == second) continue;
    for (int64_t i : rows)
      if (len.data_ptr<int64_t>()[i] == longest) baseline[i].narrow(0, second, baseline.size(1) - second).zero_();
  }
  auto advantages = (returns - baseline).gather(1, place) * p.mask;
  return {advantages, p.returns};
}

}  // namespace hybridflow::algo
