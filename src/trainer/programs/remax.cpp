// ReMax (Li et al. 2023; HybridFlow Figure 6): no critic; the baseline of a prompt's samples is the score of
// its greedy response, generated beside the sampled ones and scored exactly as they are (rule reward plus
// reward model).
#include "programs.h"

#include "hybridflow/trainer/metrics_log.h"

namespace hybridflow::programs {

nlohmann::json remax(RLStages& rl) {
  DataProto prompts = rl.next_prompts();
  Generation greedy = rl.generate(prompts, /*greedy=*/true);  // and the reward model on it
  Rollout r = rl.rollout(prompts);
  rl.score(r);
  rl.collect(r);
  algo::AdvantageInput in = rl.advantage_input(r, rl.token_rewards(r));
  const at::Tensor baseline = rl.score(greedy);
  rl.metrics().set("score/greedy_baseline_mean", baseline.to(at::kDouble).mean().item<double>());
  in.reward_baselines = baseline.repeat_interleave(r.n);
  rl.set_advantages(r, rl.advantage("remax", in));  // reward-to-go - greedy score
  rl.update(r);
  return rl.finish(r);
}

}  // namespace hybridflow::programs
