// Any registered advantage estimator without a program of its own (for example one a user registered
// with algo::register_advantage_estimator): the GRPO step with the configured estimator.
#include "programs.h"

namespace hybridflow::programs {

nlohmann::json policy_gradient(RLStages& rl) {
  const std::string estimator = rl.config().get<std::string>("algorithm.adv_estimator");
  Rollout r = rl.rollout(rl.next_prompts());
  rl.score(r);
  rl.collect(r);
  algo::AdvantageInput in = rl.advantage_input(r, rl.token_rewards(r));
  rl.set_advantages(r, rl.advantage(estimator, in));
  rl.update(r);
  return rl.finish(r);
}

}  // namespace hybridflow::programs
