// DAPO (Yu et al. 2025): GRPO with dynamic sampling. A group whose samples all score the same has zero
// advantage everywhere and teaches nothing, so such groups are dropped and more prompts are generated
// (data.gen_batch_size at a time) until data.train_batch_size prompts with varied scores are gathered
// (verl's algorithm.filter_groups). Clip-higher (actor.clip_ratio_high), token-mean aggregation and the
// overlong penalty (reward_model.overlong_buffer) are settings of the roles. Its settings are checked when
// the trainer is built (the algorithm spec, run_spec_builders.cpp), and it reads them from step.spec().
#include "programs.h"

#include "hybridflow/algo/dapo.h"
#include "hybridflow/core/error.h"
#include "hybridflow/trainer/metrics_log.h"

namespace hybridflow::programs {

nlohmann::json dapo(RLStep& step) {
  auto& [actor, ref, critic, reward, cost, cost_critic] = step.roles();
  const RunSpec& spec = step.spec();
  const int64_t want = spec.data.train_batch_size;
  const int64_t per_round = spec.data.gen_batch_size;
  const int64_t max_rounds = spec.algorithm.filter_groups.max_num_gen_batches;
  std::vector<DataProto> kept;
  std::vector<at::Tensor> kept_scores;
  int64_t n = 1, groups = 0, rounds = 0, seen = 0;
  while (groups < want) {
    HF_CHECK(max_rounds <= 0 || rounds < max_rounds, "dapo: after algorithm.filter_groups.max_num_gen_batches = ",
             max_rounds, " generations only ", groups, " of data.train_batch_size = ", want,
             " prompts had samples that scored differently; raise max_num_gen_batches (0 = no limit) or make the ",
             "task less uniform for this policy");
    RolloutBatch round = actor.generate_sequences(step.next_prompts(per_round));
    reward.compute_reward(round).join();
    n = round.n();
    const at::Tensor group = at::arange(round.scores().size(0) / n, at::kLong).repeat_interleave(n);
    const at::Tensor rows = algo::dynamic_sampling_keep(round.scores(), group).nonzero().view(-1);  // of kept groups
    ++rounds;
    seen += per_round;
    if (rows.numel() == 0) continue;
    kept.push_back(round.data().index_select(rows));
    kept_scores.push_back(round.scores().index_select(0, rows));
    groups += rows.numel() / n;
  }
  step.metrics().set("dapo/num_gen_batches", static_cast<double>(rounds));
  step.metrics().set("dapo/kept_group_fraction", static_cast<double>(groups) / static_cast<double>(seen));
  RolloutBatch batch =
      step.batch_of(step.concat(kept).slice(0, want * n), n, at::cat(kept_scores).slice(0, 0, want * n));
  Pending old_log_prob = actor.compute_log_prob(batch);
  Pending ref_log_prob = ref ? ref->compute_log_prob(batch) : Pending();
  Pending values = critic ? critic->compute_values(batch) : Pending();
  join(old_log_prob, ref_log_prob, values);
  step.compute_advantage(batch, step.adv_estimator());
  Pending critic_updated = critic ? critic->update_critic(batch) : Pending();
  Pending actor_updated = actor.update_actor(batch);
  join(critic_updated, actor_updated);
  return step.finish(batch);
}

}  // namespace hybridflow::programs
