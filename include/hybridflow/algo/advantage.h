// Advantage estimators, looked up by verl's algorithm.adv_estimator name.
// Adding one = write a function AdvantageOutput(const AdvantageInput&) and call register_advantage_estimator.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <string>
#include <vector>

namespace hybridflow::algo {

// Inputs shared by all estimators; each uses the fields it needs and checks they are set.
// A per-sequence reward given as token_level_rewards sits at the last valid token (the others are 0),
// so its row sum is the sequence score.
struct AdvantageInput {
  at::Tensor token_level_rewards;  // [B, R] float
  at::Tensor response_mask;        // [B, R], 1 = real response token
  at::Tensor values;               // [B, R] critic values (gae)
  at::Tensor index;                // [B] int64 group ids; rows with equal ids answer the same prompt (grpo, rloo)
  at::Tensor reward_baselines;     // [B] reward of the greedy response (remax)
  at::Tensor old_log_probs;        // [B, R] log p of each response token under the old policy (optimal_token_baseline)
  at::Tensor sum_pi_squared;       // [B, R] sum over the vocabulary of p^2 at each position (optimal_token_baseline)
  at::Tensor rollout_is_weights;   // [B, R] rollout importance weights, when the run computes them (optimal_token_baseline)
  double gamma = 1.0;
  double lam = 1.0;
  bool norm_adv_by_std_in_grpo = true;
  double epsilon = 1e-6;  // added to the group std (grpo)
};

// advantages and returns are [B, R] and exactly 0 at padded positions.
struct AdvantageOutput {
  at::Tensor advantages;
  at::Tensor returns;
};

using AdvantageEstimator = std::function<AdvantageOutput(const AdvantageInput&)>;

// Registers (or replaces) an estimator under name. Built-ins: gae, grpo, rloo, remax, reinforce_plus_plus,
// reinforce_plus_plus_baseline, gpg, optimal_token_baseline, tir_optimal_token_baseline.
void register_advantage_estimator(const std::string& name, AdvantageEstimator fn);
// Throws hybridflow::Error listing the known names when name is unknown.
AdvantageEstimator get_advantage_estimator(const std::string& name);
bool has_advantage_estimator(const std::string& name);
std::vector<std::string> advantage_estimator_names();  // sorted
AdvantageOutput compute_advantage(const std::string& name, const AdvantageInput& input);

// The built-in estimators (also callable directly).
// GAE: delta_t = r_t + gamma V_{t+1} - V_t, A_t = delta_t + gamma lam A_{t+1}, over valid tokens only
// (a masked position is skipped: it neither uses nor breaks the recursion); returns = A + V; A whitened.
AdvantageOutput compute_gae_advantage(const AdvantageInput& in);
// GRPO: score = row sum of rewards; A = (score - group mean) / (group std + eps) (or without the std);
// a group of one has mean 0 and std 1. Broadcast over valid tokens; returns = advantages.
AdvantageOutput compute_grpo_advantage(const AdvantageInput& in);
// RLOO: A_i = score_i - mean of the other scores of the group; a group of one keeps its score.
AdvantageOutput compute_rloo_advantage(const AdvantageInput& in);
// ReMax: returns = undiscounted reward-to-go, sum_{s >= t} m_s r_s (carried across masked spans, as verl's
// reverse cumsum); A = returns - reward_baselines (broadcast over valid tokens).
AdvantageOutput compute_remax_advantage(const AdvantageInput& in);
// REINFORCE++: returns = discounted reward-to-go (gamma) over valid tokens, carried across a masked span
// inside the response (where verl restarts it); A = masked whitening of the returns.
AdvantageOutput compute_reinforce_plus_plus_advantage(const AdvantageInput& in);
// REINFORCE++ with a group baseline (arXiv 2501.03262): score - group mean (a group of one keeps its score),
// broadcast over valid tokens, then whitened over the batch's valid tokens; returns = advantages.
AdvantageOutput compute_reinforce_plus_plus_baseline_advantage(const AdvantageInput& in);
// GPG (arXiv 2504.02546): A = alpha (score - group mean), alpha = rows / rows with a nonzero score (at least 1
// row counted), so that the batch's gradient is not diluted by groups that all scored 0; a group of one has
// mean 0. Broadcast over valid tokens; returns = advantages.
AdvantageOutput compute_gpg_advantage(const AdvantageInput& in);
// Optimal token baseline (verl's optimal_token_baseline): returns G_t = reward-to-go over valid tokens; each
// position's weight w_t = 1 - 2 p_t + sum p^2 (p_t = exp(old_log_probs), times rollout_is_weights^2 when
// given) and its path weight W_t = sum_{s <= t} w_s; the group's baseline at position t is
// sum_i G_it W_it / (sum_i W_it + 1e-8) over the group's rows valid at t; A = G - baseline over valid tokens.
// A group of one has baseline 0.
AdvantageOutput compute_optimal_token_baseline_advantage(const AdvantageInput& in);
// The same for multi-turn responses (verl's tir_optimal_token_baseline): a row's valid tokens are taken in
// order, skipping masked tool-output spans, so the baseline at a row's k-th generated token is the group's
// over their k-th generated tokens, wherever those sit; rows without a valid token take no part. When one
// row of a group is longer than all the others, its tokens past the second longest get baseline 0 (verl's
// handle_zero_tail, on for this estimator). A = G - baseline over valid tokens; returns = G.
AdvantageOutput compute_tir_optimal_token_baseline_advantage(const AdvantageInput& in);

}  // namespace hybridflow::algo
