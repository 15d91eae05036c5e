// The role handles of trainer/rl_roles.h: each names the call a program makes; the step's side here
// dispatches it on the worker group at once and, when the program joins it, waits (timed under the stage's
// name) and puts the result into its batch or the step's metrics.
#include "hybridflow/trainer/rl_roles.h"

#include <algorithm>
#include <numeric>
#include <set>

#include "hybridflow/algo/dapo.h"
#include "hybridflow/algo/pf_ppo.h"
#include "hybridflow/algo/rollout_correction.h"
#include "hybridflow/engine/seqlen_balancing.h"
#include "hybridflow/runtime/protocol.h"
#include "hybridflow/runtime/select_rows.h"
#include "hybridflow/workers/router_replay.h"
#include "rl_stages.h"
#include "score_guard.h"

namespace hybridflow {

namespace {

torch::Tensor to_float_tensor(const std::vector<double>& values) {
  return torch::tensor(values, torch::kDouble).to(torch::kFloat);
}

// Each role's LR schedule sits at this RL step, however many optimizer steps the update takes.
DataProto at_schedule_step(DataProto batch, int64_t step) {
  batch.meta()["schedule_step"] = step;
  return batch;
}

}  // namespace

int64_t RolloutBatch::n() const { return TrainerStages::state_of(*this).n; }

DataProto& RolloutBatch::data() {
  RolloutBatchState& b = TrainerStages::state_of(*this);
  return b.step->wait_generation(b);
}

const at::Tensor& RolloutBatch::scores() const {
  const RolloutBatchState& b = TrainerStages::state_of(*this);
  HF_CHECK(b.scores.defined(), "RolloutBatch::scores: join the batch's reward.compute_reward first");
  return b.scores;
}

const at::Tensor& RolloutBatch::costs() const {
  const RolloutBatchState& b = TrainerStages::state_of(*this);
  HF_CHECK(b.costs.defined(), "RolloutBatch::costs: join the batch's cost->compute_cost first");
  return b.costs;
}

void RolloutBatch::set_advantages(const algo::AdvantageOutput& adv) {
  DataProto& batch = data();
  batch.set_tensor("advantages", adv.advantages.to(torch::kFloat));
  batch.set_tensor("returns", adv.returns.to(torch::kFloat));
}

void RolloutBatch::set_cost_advantages(const algo::AdvantageOutput& cost_adv) {
  DataProto& batch = data();
  batch.set_tensor("cost_returns", cost_adv.returns.to(torch::kFloat));
  state_->step->metrics().set(
      "cost_advantages/mean",
      algo::masked_mean(cost_adv.advantages, batch.tensor("response_mask").to(torch::kFloat)).item<double>());
}

RolloutBatch ActorRollout::generate_sequences(const DataProto& prompts, Decoding decoding) {
  return step_->generate(prompts, decoding);
}

Pending ActorRollout::compute_log_prob(const RolloutBatch& batch) { return step_->old_log_prob(batch); }

Pending ActorRollout::update_actor(const RolloutBatch& batch) { return step_->update_actor(batch); }

Pending Reference::compute_log_prob(const RolloutBatch& batch) { return step_->ref_log_prob(batch); }

Pending Critic::compute_values(const RolloutBatch& batch) { return step_->values(batch, of_cost_); }

Pending Critic::update_critic(const RolloutBatch& batch) { return step_->update_critic(batch, of_cost_); }

Pending Reward::compute_reward(const RolloutBatch& batch) { return step_->reward(batch); }

Pending Cost::compute_cost(const RolloutBatch& batch) { return step_->cost(batch); }

// The rule reward and the reward model; the rule cost and the cost model.
torch::Tensor TrainerStages::sequence_scores(const DataProto& gen, const Future& rm_score,
                                             std::map<std::string, double>& parts) {
  auto t = timer_.scope("reward");
  const ScoringSpec& scoring = s_.run.scoring;
  const auto& clip = scoring.reward_clip;
  int64_t clipped = 0;
  torch::Tensor scores;
  {
    ControllerSpan span(*s_.timeline, "rule_score");
    scores = guard_scores(to_float_tensor(s_.rule_scores(gen)), "the rule reward (reward.type " +
                          scoring.reward_type + ")", s_.step + 1, clip, &clipped);
  }
  parts["score/rule_mean"] = mean_of(scores);
  if (rm_score.valid()) {
    parts["score/rm_mean"] = mean_of(rm_score.get().tensor("rm_scores"));
    scores = scores + guard_scores(rm_score.get().tensor("rm_scores"), "the reward model", s_.step + 1, clip, &clipped);
  }
  const ScoringSpec::OverlongBuffer& overlong = scoring.overlong_buffer;
  if (overlong.enable) {
    // DAPO's soft overlong punishment: responses that run into the last `len` tokens lose up to penalty_factor.
    const auto lengths = gen.tensor("response_mask").to(torch::kFloat).sum(1);
    const int64_t max_length = overlong.max_resp_len > 0 ? overlong.max_resp_len : s_.specs.rollout.response_length;
    const auto penalty = algo::overlong_penalty(lengths, max_length, overlong.len, overlong.penalty_factor);
    if (overlong.log) parts["score/overlong_penalty_mean"] = mean_of(penalty);
    scores = scores + penalty;
  }
  if (clip) {
    scores = guard_scores(scores, "the summed score", s_.step + 1, clip, &clipped);
    parts["score/clipped"] = static_cast<double>(clipped);
  }
  return scores;
}

torch::Tensor TrainerStages::sequence_costs(const DataProto& gen, const Future& cost_score) {
  auto t = timer_.scope("cost");
  torch::Tensor costs = guard_scores(to_float_tensor(s_.rule_costs(gen)),
                                     "the cost (cost.type " + s_.run.scoring.cost_type + ")", s_.step + 1, {});
  if (cost_score.valid())
    costs = costs + guard_scores(cost_score.get().tensor("rm_scores"), "the cost model", s_.step + 1, {});
  return costs;
}

Pending TrainerStages::reward(const RolloutBatch& batch) {
  auto b = batch.state_;
  state_of(batch);
  if (b->scores.defined()) return Pending();  // scored when it was made (batch_of)
  Future rm_score;
  if (s_.reward_model) rm_score = s_.reward_model->call("compute_rm_score", b->generation);
  return Pending([this, b, rm_score] { b->scores = sequence_scores(wait_generation(*b), rm_score, b->score_metrics); });
}

Pending TrainerStages::cost(const RolloutBatch& batch) {
  auto b = batch.state_;
  state_of(batch);
  Future cost_score;
  if (s_.cost_model) cost_score = s_.cost_model->call("compute_rm_score", b->generation);
  return Pending([this, b, cost_score] { b->costs = sequence_costs(wait_generation(*b), cost_score); });
}

// Old and reference log-probs and values, joined into their batch.
Pending TrainerStages::old_log_prob(const RolloutBatch& batch) {
  auto b = batch.state_;
  state_of(batch);
  // verl's bypass mode: the rollout's own log-probs are the old policy's, so the actor's pass is skipped.
  BalancedCall log_prob;
  if (!s_.run.algorithm.bypass_mode) log_prob = call_on_generation(*s_.actor, "compute_log_prob", *b);
  return Pending([this, b, log_prob] {
    DataProto& data = wait_generation(*b);
    if (log_prob.result.valid()) {
      auto t = timer_.scope("old_log_prob");
      data.update(in_batch_order(log_prob.result.get(), log_prob.order));
      for (const auto& [key, value] : take_routing_metrics(data)) s_.metrics->set(key, value);
    } else {
      HF_CHECK(data.has_tensor("rollout_log_probs"), "compute_log_prob: algorithm.rollout_correction.bypass_mode ",
               "takes the old log-probs from the rollout, but the batch has no rollout_log_probs");
      data.set_tensor("old_log_probs", data.tensor("rollout_log_probs") * data.tensor("response_mask").to(torch::kFloat));
    }
    // The generating policy against the one about to train (another dtype, or updates behind): logged, and
    // with algorithm.rollout_correction's rollout_is / rollout_rs the actor's loss is weighted by the ratio
    // and rejected tokens leave it. In bypass mode the two policies are one here: the actor corrects each
    // micro-batch against its current policy instead (update_actor).
    if (data.has_tensor("rollout_log_probs") && data.has_tensor("old_log_probs")) {
      const auto correction = algo::rollout_correction(
          data.tensor("old_log_probs"), data.tensor("rollout_log_probs"), data.tensor("response_mask"),
          s_.run.algorithm.bypass_mode ? algo::RolloutCorrectionConfig{} : s_.run.algorithm.rollout_correction);
      for (const auto& [key, value] : correction.metrics) s_.metrics->set(key, value);
      if (correction.weights.defined()) data.set_tensor("rollout_is_weights", correction.weights);
      if (correction.keep_mask.defined()) data.set_tensor("rollout_keep_mask", correction.keep_mask);
    }
  });
}

Pending TrainerStages::ref_log_prob(const RolloutBatch& batch) {
  auto b = batch.state_;
  state_of(batch);
  const BalancedCall log_prob = call_on_generation(*s_.actor, "compute_ref_log_prob", *b);
  return Pending([this, b, log_prob] {
    DataProto& data = wait_generation(*b);
    auto t = timer_.scope("ref");
    data.update(in_batch_order(log_prob.result.get(), log_prob.order));
  });
}

Pending TrainerStages::values(const RolloutBatch& batch, bool of_cost) {
  auto b = batch.state_;
  state_of(batch);
  const BalancedCall result = call_on_generation(of_cost ? *s_.cost_critic : *s_.critic, "compute_values", *b);
  return Pending([this, b, result, of_cost] {
    DataProto& data = wait_generation(*b);
    auto t = timer_.scope(of_cost ? "cost_values" : "values");
    const DataProto values = in_batch_order(result.result.get(), result.order);
    if (of_cost)
      data.set_tensor("cost_values", values.tensor("values"));
    else
      data.update(values);
  });
}
// The updates: dispatched on the batch, joined into the step's metrics.
void TrainerStages::add_update_metrics(const Future& update, const std::string& rename_prefix) {
  bool skipped = false;
  for (const auto& [k, v] : update.get().meta().at("metrics").items()) {
    // JSON has no NaN or inf: a worker's non-finite loss or gradient norm arrives as null.
    s_.metrics->set(!rename_prefix.empty() && k.rfind("critic/", 0) == 0 ? rename_prefix + k : k,
                    v.is_number() ? v.get<double>() : std::nan(""));
    skipped = skipped || (k.size() >= 13 && k.compare(k.size() - 13, 13, "skipped_steps") == 0);
  }
  ++updates_;
  nonfinite_updates_ += skipped;
}

DataProto TrainerStages::balanced(const WorkerGroup& group, const std::string& method, DataProto request,
                                  bool log_metrics) {
  const std::vector<int64_t> order = balanced_order(group, method, request, log_metrics);
  // Rows the controller fetched from the workers stay there: each rank fetches its own (runtime/select_rows.h).
  return order.empty() ? request : select_rows(request, order);
}

TrainerStages::BalancedCall TrainerStages::call_on_generation(WorkerGroup& group, const std::string& method,
                                                              RolloutBatchState& b) {
  if (!s_.run.trainer.balance_batch || dispatch_row_chunks(group.methods().at(method), group.coords()) == 1)
    return {group.call(method, b.generation), {}};
  const DataProto& data = wait_generation(b);
  BalancedCall call;
  call.order = balanced_order(group, method, data, /*log_metrics=*/false);
  call.result = group.call(method, call.order.empty() ? data : select_rows(data, call.order));
  return call;
}

DataProto TrainerStages::in_batch_order(const DataProto& result, const std::vector<int64_t>& order) {
  if (order.empty()) return result;
  std::vector<int64_t> inverse(order.size());
  for (size_t i = 0; i < order.size(); ++i) inverse[static_cast<size_t>(order[i])] = static_cast<int64_t>(i);
  return select_rows(result, inverse);
}

std::vector<int64_t> TrainerStages::balanced_order(const WorkerGroup& group, const std::string& method,
                                                   const DataProto& request, bool log_metrics) {
  if (!s_.run.trainer.balance_batch) return {};
  // The parts the call's protocol cuts the rows into: one per data-parallel rank.
  const int64_t parts = dispatch_row_chunks(group.methods().at(method), group.coords());
  const int64_t rows = request.batch_size();
  if (rows == 0 || rows % parts != 0) return {};  // the call names an uneven batch itself
  const auto counts = request.tensor("attention_mask").sum(1).to(torch::kCPU, torch::kLong).contiguous();
  const std::vector<int64_t> lengths(counts.data_ptr<int64_t>(), counts.data_ptr<int64_t>() + rows);
  // A rank's time follows the work of its rows, attention's quadratic part included, not just their tokens.
  std::vector<int64_t> work(lengths.size());
  for (size_t i = 0; i < lengths.size(); ++i) work[i] = sequence_workload(lengths[i], s_.model_config.hidden_size);
  const std::vector<int64_t> order = balanced_row_order(work, parts);
  if (log_metrics) {  // verl's names: the chunks' tokens as the rows came, then as balanced
    const auto before = chunk_token_sums(lengths, parts), after = chunk_token_sums(lengths, parts, order);
    const auto [lo, hi] = std::minmax_element(before.begin(), before.end());
    const auto [balanced_lo, balanced_hi] = std::minmax_element(after.begin(), after.end());
    s_.metrics->set("global_seqlen/min", static_cast<double>(*lo));
    s_.metrics->set("global_seqlen/max", static_cast<double>(*hi));
    s_.metrics->set("global_seqlen/minmax_diff", static_cast<double>(*hi - *lo));
    s_.metrics->set("global_seqlen/balanced_min", static_cast<double>(*balanced_lo));
    s_.metrics->set("global_seqlen/balanced_max", static_cast<double>(*balanced_hi));
    s_.metrics->set("global_seqlen/mean",
                    static_cast<double>(std::accumulate(lengths.begin(), lengths.end(), int64_t{0})) /
                        static_cast<double>(parts));
  }
  if (parts == 1) return {};
  return order;
}

DataProto TrainerStages::pf_ppo_resampled(RolloutBatchState& b, DataProto request) {
  if (!s_.run.algorithm.use_pf_ppo) return request;
  if (b.update_rows.empty()) {
    HF_CHECK(b.scores.defined(), "algorithm.use_pf_ppo: join the batch's reward.compute_reward before its updates");
    const uint64_t seed = s_.run.trainer.seed * 100003ULL + static_cast<uint64_t>(s_.step) + 0x9f9f0ULL;
    b.update_rows = algo::pf_ppo_resample(b.scores, s_.run.algorithm.pf_ppo, seed);
    // What the filter kept: the drawn rows' mean score (against score/mean) and how many rows it drew at all.
    const auto drawn = torch::tensor(b.update_rows, torch::kLong);
    s_.metrics->set("pf_ppo/score_mean", b.scores.to(torch::kCPU, torch::kDouble).index_select(0, drawn).mean().item<double>());
    s_.metrics->set("pf_ppo/distinct_rows",
                    static_cast<double>(std::set<int64_t>(b.update_rows.begin(), b.update_rows.end()).size()));
  }
  HF_CHECK(request.batch_size() == static_cast<int64_t>(b.update_rows.size()), "algorithm.use_pf_ppo: an update of ",
           request.batch_size(), " rows on a batch of ", b.update_rows.size());
  return select_rows(request, b.update_rows);  // the workers keep the rows they hold (runtime/select_rows.h)
}

Pending TrainerStages::update_critic(const RolloutBatch& batch, bool of_cost) {
  RolloutBatchState& b = state_of(batch);
  const DataProto& data = wait_generation(b);
  Future update;
  if (of_cost) {
    HF_CHECK(data.has_tensor("cost_returns"), "update_critic: the cost critic needs cost returns ",
             "(batch.set_cost_advantages)");
    DataProto cost_batch = data.select({"input_ids", "attention_mask", "responses", "response_mask"});
    cost_batch.set_tensor("values", data.tensor("cost_values"));
    cost_batch.set_tensor("returns", data.tensor("cost_returns"));
    cost_batch = pf_ppo_resampled(b, std::move(cost_batch));
    update = s_.cost_critic->call("update_critic",
                                  at_schedule_step(balanced(*s_.cost_critic, "update_critic", cost_batch), s_.step));
  } else {
    HF_CHECK(data.has_tensor("returns"), "update_critic: set the batch's advantages first (batch.set_advantages)");
    const DataProto request = pf_ppo_resampled(
        b, data.select({"input_ids", "attention_mask", "responses", "response_mask", "values", "returns"}));
    update = s_.critic->call("update_critic", at_schedule_step(balanced(*s_.critic, "update_critic", request), s_.step));
  }
  return Pending([this, update, of_cost] {
    auto t = timer_.scope(of_cost ? "update_cost_critic" : "update_critic");
    // The critic worker names its metrics critic/*; the cost critic's become cost_critic/*.
    add_update_metrics(update, of_cost ? "cost_" : "");
  });
}

Pending TrainerStages::update_actor(const RolloutBatch& batch) {
  RolloutBatchState& b = state_of(batch);
  const DataProto& data = wait_generation(b);
  HF_CHECK(data.has_tensor("advantages"), "update_actor: set the batch's advantages first (batch.set_advantages)");
  std::vector<std::string> keys = {"input_ids", "attention_mask", "responses", "response_mask",
                                   "old_log_probs", "advantages"};
  if (data.has_tensor("ref_log_prob")) keys.push_back("ref_log_prob");
  if (data.has_tensor("rollout_is_weights")) keys.push_back("rollout_is_weights");
  if (data.has_tensor("routed_experts")) keys.push_back("routed_experts");  // router replay (R2, R3)
  DataProto request = at_schedule_step(data.select(keys), s_.step);
  // Rejected tokens (rollout_rs, veto) leave the actor's loss, its denominator included, as verl's do.
  if (data.has_tensor("rollout_keep_mask"))
    request.set_tensor("response_mask",
                       data.tensor("rollout_keep_mask").to(data.tensor("response_mask").scalar_type()));
  if (s_.run.algorithm.bypass_mode)
    request.meta()["rollout_correction"] = algo::to_json(s_.run.algorithm.rollout_correction);
  // trainer.critic_warmup: the first steps leave the actor as it is; its learning-rate schedule starts with
  // its first update, as verl's scheduler (stepped by the updates) does. The versions and the weight sync
  // below still advance, so that an off-policy pipeline's bookkeeping does not depend on the warm-up.
  const int64_t warmup = s_.run.trainer.critic_warmup;
  const bool warming_up = s_.step < warmup;
  request = pf_ppo_resampled(b, std::move(request));
  request = at_schedule_step(balanced(*s_.actor, "update_actor", std::move(request), /*log_metrics=*/true),
                             s_.step - warmup);
  Future update = warming_up ? Future() : s_.actor->call("update_actor", request);
  return Pending([this, update, warming_up] {
    if (!warming_up) {
      auto t = timer_.scope("update_actor");
      add_update_metrics(update);
    }
    s_.actor_version = s_.step + 1;  // what a restarted rollout pool gets
    // The new weights to the standalone rollout pool, straight from the actor's processes, every
    // trigger_parameter_sync_step updates; finish() waits.
    if (s_.rollout && (s_.step + 1) % s_.placement.sync_every == 0) weight_sync_ = s_.dispatch_weight_sync(s_.step + 1);
  });
}

}  // namespace hybridflow
