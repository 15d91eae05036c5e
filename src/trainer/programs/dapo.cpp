// DAPO (Yu et al. 2025): GRPO with dynamic sampling. A group whose samples all score the same has zero
// advantage everywhere and teaches nothing, so such groups are dropped and more prompts are generated
// (data.gen_batch_size at a time) until data.train_batch_size prompts with varied scores are gathered
// (verl's algorithm.filter_groups). Clip-higher (actor.clip_ratio_high), token-mean aggregation and the
// overlong penalty (reward_model.overlong_buffer) are settings of the shared stages.
#include "programs.h"

#include "hybridflow/algo/dapo.h"
#include "hybridflow/core/error.h"
#include "hybridflow/trainer/metrics_log.h"

namespace hybridflow::programs {

nlohmann::json dapo(RLStages& rl) {
  const Config& c = rl.config();
  const int64_t want = c.get<int64_t>("data.train_batch_size");
  const int64_t per_round = c.is_null("data.gen_batch_size") ? want : c.get<int64_t>("data.gen_batch_size");
  const int64_t max_rounds = c.get<int64_t>("algorithm.filter_groups.max_num_gen_batches");
  const int64_t n = c.get<int64_t>("actor_rollout_ref.rollout.n");
  const std::string estimator = c.get<std::string>("algorithm.adv_estimator");
  HF_CHECK(estimator != "remax", "dapo (algorithm.filter_groups.enable): adv_estimator remax needs greedy baselines ",
           "that dynamic sampling does not generate; use grpo, rloo or reinforce_plus_plus");
  if (!c.is_null("algorithm.filter_groups.metric")) {
    // Every score here is one number per sequence (rule + reward model + overlong penalty): verl's acc,
    // score and seq_reward name it; seq_final_reward (after the KL penalty) is not computed before filtering.
    const std::string metric = c.get<std::string>("algorithm.filter_groups.metric");
    HF_CHECK(metric == "acc" || metric == "score" || metric == "seq_reward",
             "algorithm.filter_groups.metric: expected acc, score or seq_reward (all the sequence score), got '",
             metric, "'");
  }
  std::vector<DataProto> kept;
  std::vector<at::Tensor> kept_scores;
  int64_t groups = 0, rounds = 0, seen = 0;
  while (groups < want) {
    HF_CHECK(max_rounds <= 0 || rounds < max_rounds, "dapo: after algorithm.filter_groups.max_num_gen_batches = ",
             max_rounds, " generations only ", groups, " of data.train_batch_size = ", want,
             " prompts had samples that scored differently; raise max_num_gen_batches (0 = no limit) or make the ",
             "task less uniform for this policy");
    Generation g = rl.generate(rl.next_prompts(per_round));
    const at::Tensor scores = rl.score(g);
    const at::Tensor group = at::arange(scores.size(0) / n, at::kLong).repeat_interleave(n);
    const at::Tensor rows = algo::dynamic_sampling_keep(scores, group).nonzero().view(-1);  // rows of kept groups
    ++rounds;
    seen += per_round;
    if (rows.numel() == 0) continue;
    kept.push_back(g.batch.get().index_select(rows));
    kept_scores.push_back(scores.index_select(0, rows));
    groups += rows.numel() / n;
  }
  rl.metrics().set("dapo/num_gen_batches", static_cast<double>(rounds));
  rl.metrics().set("dapo/kept_group_fraction", static_cast<double>(groups) / static_cast<double>(seen));
  const DataProto batch = rl.concat(kept).slice(0, want * n);
  Rollout r = rl.rollout_of(batch, n, at::cat(kept_scores).slice(0, 0, want * n));
  rl.score(r);  // scored already: logs the kept samples' scores
  rl.collect(r);
  algo::AdvantageInput in = rl.advantage_input(r, rl.token_rewards(r));
  rl.set_advantages(r, rl.advantage(estimator, in));
  rl.update(r);
  return rl.finish(r);
}

}  // namespace hybridflow::programs
