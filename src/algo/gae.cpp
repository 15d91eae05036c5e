#include <torch/torch.h>

#include "checks.h"
#include "hybridflow/algo/advantage.h"
#include "hybridflow/algo/masked.h"

namespace hybridflow::algo {

AdvantageOutput compute_gae_advantage(const AdvantageInput& in) {
  constexpr const char* kWhere = "algo: gae";
  detail::check_response_tensor(in.token_level_rewards, "token_level_rewards", kWhere);
  detail::check_same_shape(in.response_mask, in.token_level_rewards, "response_mask", kWhere);
  HF_CHECK(in.values.defined(), kWhere, ": values (critic) are required");
  detail::check_same_shape(in.values, in.token_level_rewards, "values", kWhere);

  torch::NoGradGuard no_grad;
  auto rewards = detail::as_float(in.token_level_rewards);
  auto values = in.values.to(rewards.scalar_type());
  auto mask = in.response_mask.to(rewards.scalar_type());
  const int64_t batch = rewards.size(0);
  const int64_t length = rewards.size(1);

  // Carried state skips masked positions: the next *valid* value and advantage flow through padding and
  // observation tokens, so what sits at a masked position never matters.
  auto next_value = torch::zeros({batch}, rewards.options());
  auto last_gae = torch::zeros({batch}, rewards.options());
  auto advantages = torch::zeros_like(rewards);
  for (int64_t t = length - 1; t >= 0; --t) {
    auto m = mask.select(1, t);
    auto v = values.select(1, t);
    auto delta = rewards.select(1, t) + in.gamma * next_value - v;
    auto gae = delta + in.gamma * in.lam * last_gae;
    next_value = v * m + (1 - m) * next_value;
    last_gae = gae * m + (1 - m) * last_gae;
    advantages.select(1, t).copy_(last_gae);
  }
  auto returns = (advantages + values) * mask;
  return {masked_whiten(advantages, mask), returns};
}

}  // namespace hybridflow::algo
