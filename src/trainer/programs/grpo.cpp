// GRPO (Shao et al. 2024): no critic; each prompt's rollout.n samples are scored against their group's
// mean (divided by its std unless algorithm.norm_adv_by_std_in_grpo is false: Dr. GRPO, with
// loss_agg_mode seq-mean-token-sum-norm).
#include "programs.h"

namespace hybridflow::programs {

nlohmann::json grpo(RLStages& rl) {
  Rollout r = rl.rollout(rl.next_prompts());
  rl.score(r);
  rl.collect(r);
  algo::AdvantageInput in = rl.advantage_input(r, rl.token_rewards(r));
  rl.set_advantages(r, rl.advantage("grpo", in));  // (score - group mean) / group std
  rl.update(r);
  return rl.finish(r);
}

}  // namespace hybridflow::programs
