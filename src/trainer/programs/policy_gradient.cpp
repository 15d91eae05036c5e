// The step of PPO (HybridFlow Figure 6), GRPO, RLOO, REINFORCE++ and any registered estimator: they
// differ only in how advantages are estimated from the scores (algo/advantage.h), so one program serves
// them all with the estimator as its parameter. With gae (PPO) the run has a critic: its values feed the
// estimator and it trains beside the actor. The reference joins when a KL term is configured.
#include "programs.h"

namespace hybridflow::programs {

nlohmann::json policy_gradient(RLStep& step, const std::string& estimator) {
  auto& [actor, ref, critic, reward, cost, cost_critic] = step.roles();
  RolloutBatch batch = actor.generate_sequences(step.next_prompts());
  // Everything that reads the generation is dispatched on it in flight; the pools run it concurrently
  // while the controller computes the rule reward.
  Pending scores = reward.compute_reward(batch);
  Pending old_log_prob = actor.compute_log_prob(batch);
  Pending ref_log_prob = ref ? ref->compute_log_prob(batch) : Pending();
  Pending values = critic ? critic->compute_values(batch) : Pending();
  join(scores, old_log_prob, ref_log_prob, values);
  step.compute_advantage(batch, estimator);
  // The critic and the actor update together: they overlap when they live in different pools.
  Pending critic_updated = critic ? critic->update_critic(batch) : Pending();
  Pending actor_updated = actor.update_actor(batch);
  join(critic_updated, actor_updated);
  return step.finish(batch);
}

RLProgram with_estimator(const std::string& estimator) {
  return [estimator](RLStep& step) { return policy_gradient(step, estimator); };
}

RLProgram with_configured_estimator() {
  return [](RLStep& step) { return policy_gradient(step, step.adv_estimator()); };
}

}  // namespace hybridflow::programs
