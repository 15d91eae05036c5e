// PPO (HybridFlow Figure 6): actor, critic, reference policy and reward model. The critic's values give
// GAE advantages; the critic and the actor then update together.
#include "programs.h"

namespace hybridflow::programs {

nlohmann::json ppo(RLStages& rl) {
  Rollout r = rl.rollout(rl.next_prompts());  // dispatches old log-probs, reference, values, reward model
  rl.score(r);                                // rule reward (here, meanwhile) + reward model
  rl.collect(r);                              // old and reference log-probs, values
  algo::AdvantageInput in = rl.advantage_input(r, rl.token_rewards(r));  // KL in the reward if configured
  rl.set_advantages(r, rl.advantage("gae", in));
  rl.update(r);                               // critic and actor
  return rl.finish(r);
}

}  // namespace hybridflow::programs
