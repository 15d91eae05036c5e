// Safe-RLHF (Dai et al. 2023; HybridFlow Figure 6): PPO with a cost model and a cost critic under a
// Lagrange multiplier. The multiplier steps on this rollout's mean cost against cost_limit, and the actor
// follows (A_reward - lambda A_cost) / (1 + lambda). With adv_estimator remax, the greedy responses are the
// baseline of both, scored and costed exactly as the sampled ones.
#include "programs.h"

#include "hybridflow/trainer/metrics_log.h"
#include "hybridflow/workers/rl_batch.h"

namespace hybridflow::programs {

nlohmann::json safe_rlhf(RLStages& rl) {
  const std::string estimator = rl.config().get<std::string>("algorithm.adv_estimator");
  DataProto prompts = rl.next_prompts();
  Generation greedy;
  if (estimator == "remax") greedy = rl.generate(prompts, /*greedy=*/true);
  Rollout r = rl.rollout(prompts);  // also dispatches the cost model and the cost critic's values
  rl.score(r);
  rl.cost(r);
  rl.collect(r);
  algo::AdvantageInput reward_in = rl.advantage_input(r, rl.token_rewards(r));
  algo::AdvantageInput cost_in = rl.advantage_input(r, scores_at_last_token(r.costs, reward_in.response_mask));
  cost_in.values = r.batch.has_tensor("cost_values") ? r.batch.tensor("cost_values") : at::Tensor();
  if (greedy.batch.valid()) {
    reward_in.reward_baselines = rl.score(greedy).repeat_interleave(r.n);
    cost_in.reward_baselines = rl.cost(greedy).repeat_interleave(r.n);
  }
  algo::LagrangeMultiplier& lambda = rl.lagrange();
  rl.metrics().set("lagrangian/lambda", lambda.update(r.costs.to(at::kDouble).mean().item<double>()));
  algo::AdvantageOutput adv = rl.advantage(estimator, reward_in);
  const algo::AdvantageOutput cost_adv = rl.advantage(estimator, cost_in);
  rl.set_cost_advantages(r, cost_adv);  // the cost critic's returns
  adv.advantages = lambda.combine_advantages(adv.advantages, cost_adv.advantages);
  rl.set_advantages(r, adv);
  rl.update(r);  // critic, cost critic and actor
  return rl.finish(r);
}

}  // namespace hybridflow::programs
