// Safe-RLHF (Dai et al. 2023; HybridFlow Figure 6): PPO with a cost model and a cost critic under a
// Lagrange multiplier. The multiplier steps on this rollout's mean cost against cost_limit, and the actor
// follows (A_reward - lambda A_cost) / (1 + lambda). With adv_estimator remax, the greedy responses are the
// baseline of both, scored and costed exactly as the sampled ones. Setup makes sure the run has a cost.
#include "programs.h"

#include "hybridflow/trainer/metrics_log.h"

namespace hybridflow::programs {

nlohmann::json safe_rlhf(RLStep& step) {
  auto& [actor, ref, critic, reward, cost, cost_critic] = step.roles();
  const std::string& estimator = step.adv_estimator();
  const DataProto prompts = step.next_prompts();
  RolloutBatch greedy;
  Pending greedy_score, greedy_cost;
  if (estimator == "remax") {
    greedy = actor.generate_sequences(prompts, Decoding::kGreedy);
    greedy_score = reward.compute_reward(greedy);
    greedy_cost = cost->compute_cost(greedy);
  }
  RolloutBatch batch = actor.generate_sequences(prompts);
  Pending scores = reward.compute_reward(batch);
  Pending costs = cost->compute_cost(batch);
  Pending old_log_prob = actor.compute_log_prob(batch);
  Pending ref_log_prob = ref ? ref->compute_log_prob(batch) : Pending();
  Pending values = critic ? critic->compute_values(batch) : Pending();
  Pending cost_values = cost_critic ? cost_critic->compute_values(batch) : Pending();
  join(scores, costs, old_log_prob, ref_log_prob, values, cost_values);
  algo::AdvantageInput reward_in = step.advantage_input(batch);
  algo::AdvantageInput cost_in = step.cost_advantage_input(batch);
  if (greedy.valid()) {
    join(greedy_score, greedy_cost);
    reward_in.reward_baselines = greedy.scores().repeat_interleave(batch.n());
    cost_in.reward_baselines = greedy.costs().repeat_interleave(batch.n());
  }
  algo::LagrangeMultiplier& lambda = step.lagrange();
  step.metrics().set("lagrangian/lambda", lambda.update(batch.costs().to(at::kDouble).mean().item<double>()));
  algo::AdvantageOutput adv = step.advantage(estimator, reward_in);
  const algo::AdvantageOutput cost_adv = step.advantage(estimator, cost_in);
  batch.set_cost_advantages(cost_adv);  // the cost critic's returns
  adv.advantages = lambda.combine_advantages(adv.advantages, cost_adv.advantages);
  batch.set_advantages(adv);
  Pending critic_updated = critic ? critic->update_critic(batch) : Pending();
  Pending cost_critic_updated = cost_critic ? cost_critic->update_critic(batch) : Pending();
  Pending actor_updated = actor.update_actor(batch);
  join(critic_updated, cost_critic_updated, actor_updated);
  return step.finish(batch);
}

}  // namespace hybridflow::programs
