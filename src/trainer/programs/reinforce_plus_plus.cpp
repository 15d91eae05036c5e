// REINFORCE++ (Hu 2025): no critic; the reward-to-go of each token, whitened over the whole batch.
#include "programs.h"

namespace hybridflow::programs {

nlohmann::json reinforce_plus_plus(RLStages& rl) {
  Rollout r = rl.rollout(rl.next_prompts());
  rl.score(r);
  rl.collect(r);
  algo::AdvantageInput in = rl.advantage_input(r, rl.token_rewards(r));
  rl.set_advantages(r, rl.advantage("reinforce_plus_plus", in));  // whitened discounted returns
  rl.update(r);
  return rl.finish(r);
}

}  // namespace hybridflow::programs
