// Critic-free estimators built on the reward-to-go of each token (ReMax, REINFORCE++).
#include <torch/torch.h>

#include "checks.h"
#include "hybridflow/algo/advantage.h"
#include "hybridflow/algo/masked.h"

namespace hybridflow::algo {
namespace {

// REINFORCE++: G_t = r_t + gamma G_{t+1} over the valid tokens. A masked span inside the response (a tool or
// observation in a multi-turn rollout) is skipped: the running return carries across it undiscounted, so the
// tokens before it still see the outcome reward. verl's compute_reinforce_plus_plus_outcome_advantage
// restarts the sum at a masked position instead; the two agree on every mask without such gaps (trailing
// padding leaves the running return 0 either way). Masked outputs are 0.
at::Tensor discounted_return_across_gaps(const at::Tensor& rewards, const at::Tensor& mask, double gamma) {
  auto returns = torch::zeros_like(rewards);
  auto running = torch::zeros({rewards.size(0)}, rewards.options());
  for (int64_t t = rewards.size(1) - 1; t >= 0; --t) {
    auto valid = mask.select(1, t) != 0;
    auto reward = torch::where(valid, rewards.select(1, t), torch::zeros_like(running));
    running = torch::where(valid, reward + gamma * running, running);
    returns.select(1, t).copy_(torch::where(valid, running, torch::zeros_like(running)));
  }
  return returns;
}

// ReMax (verl's compute_remax_outcome_advantage): the reverse cumulative sum of the masked rewards, so
// the return carries across a masked span inside the response (a tool output, say) instead of restarting
// after it. verl leaves that sum at the masked positions too; here they are 0.
at::Tensor reward_to_go_across_gaps(const at::Tensor& rewards, const at::Tensor& mask) {
  auto masked = torch::where(mask != 0, rewards, torch::zeros_like(rewards)) * mask;
  return masked.flip({-1}).cumsum(-1).flip({-1}) * mask;
}

}  // namespace

AdvantageOutput compute_remax_advantage(const AdvantageInput& in) {
  constexpr const char* kWhere = "algo: remax";
  detail::check_response_tensor(in.token_level_rewards, "token_level_rewards", kWhere);
  detail::check_same_shape(in.response_mask, in.token_level_rewards, "response_mask", kWhere);
  detail::check_per_sequence(in.reward_baselines, in.token_level_rewards.size(0), "reward_baselines", kWhere);
  torch::NoGradGuard no_grad;
  auto rewards = detail::as_float(in.token_level_rewards);
  auto mask = in.response_mask.to(rewards.scalar_type());
  auto returns = reward_to_go_across_gaps(rewards, mask);
  auto advantages = returns - in.reward_baselines.to(rewards.scalar_type()).unsqueeze(-1) * mask;
  return {advantages, returns};
}

AdvantageOutput compute_reinforce_plus_plus_advantage(const AdvantageInput& in) {
  constexpr const char* kWhere = "algo: reinforce_plus_plus";
  detail::check_response_tensor(in.token_level_rewards, "token_level_rewards", kWhere);
  detail::check_same_shape(in.response_mask, in.token_level_rewards, "response_mask", kWhere);
  torch::NoGradGuard no_grad;
  auto rewards = detail::as_float(in.token_level_rewards);
  auto mask = in.response_mask.to(rewards.scalar_type());
  auto returns = discounted_return_across_gaps(rewards, mask, in.gamma);
  return {masked_whiten(returns, mask), returns};
}

}  // namespace hybridflow::algo
