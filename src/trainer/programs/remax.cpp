// ReMax (Li et al. 2023; HybridFlow Figure 6): no critic; the baseline of a prompt's samples is the score of
// its greedy response, generated beside the sampled ones and scored exactly as they are (rule reward plus
// reward model).
#include "programs.h"

#include "hybridflow/trainer/metrics_log.h"

namespace hybridflow::programs {

nlohmann::json remax(RLStep& step) {
  auto& [actor, ref, critic, reward, cost, cost_critic] = step.roles();
  const DataProto prompts = step.next_prompts();
  RolloutBatch greedy = actor.generate_sequences(prompts, Decoding::kGreedy);
  Pending baseline = reward.compute_reward(greedy);
  RolloutBatch batch = actor.generate_sequences(prompts);
  Pending scores = reward.compute_reward(batch);
  Pending old_log_prob = actor.compute_log_prob(batch);
  Pending ref_log_prob = ref ? ref->compute_log_prob(batch) : Pending();
  join(scores, old_log_prob, ref_log_prob);
  algo::AdvantageInput in = step.advantage_input(batch);
  join(baseline);
  step.metrics().set("score/greedy_baseline_mean", greedy.scores().to(at::kDouble).mean().item<double>());
  in.reward_baselines = greedy.scores().repeat_interleave(batch.n());
  batch.set_advantages(step.advantage("remax", in));  // reward-to-go - greedy score
  actor.update_actor(batch).join();
  return step.finish(batch);
}

}  // namespace hybridflow::programs
