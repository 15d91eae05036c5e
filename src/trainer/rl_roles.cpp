// The role handles of trainer/rl_roles.h: each names the call a program makes, the step behind it
// (rl_stages.cpp) dispatches it on the worker group and joins its result.
#include "hybridflow/trainer/rl_roles.h"

#include "rl_stages.h"

namespace hybridflow {

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

}  // namespace hybridflow
