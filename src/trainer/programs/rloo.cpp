// RLOO (Ahmadian et al. 2024): no critic; each sample's baseline is the mean score of the other samples
// of its prompt.
#include "programs.h"

namespace hybridflow::programs {

nlohmann::json rloo(RLStages& rl) {
  Rollout r = rl.rollout(rl.next_prompts());
  rl.score(r);
  rl.collect(r);
  algo::AdvantageInput in = rl.advantage_input(r, rl.token_rewards(r));
  rl.set_advantages(r, rl.advantage("rloo", in));  // score - mean of the other samples' scores
  rl.update(r);
  return rl.finish(r);
}

}  // namespace hybridflow::programs
