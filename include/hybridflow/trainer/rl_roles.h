// The worker groups of an RL run as an algorithm program sees them (HybridFlow Figure 6): one typed handle
// per role, whose methods dispatch a call and return at once. What a call returns is a Pending: the
// program dispatches everything that can run together first and joins the results afterwards, so that the
// pools overlap whether they share GPUs (colocated) or not (split placements).
//
//   RolloutBatch batch = actor.generate_sequences(prompts);     // dispatched
//   Pending values = critic->compute_values(batch);             // dispatched on the generation in flight
//   Pending ref_log_prob = ref->compute_log_prob(batch);
//   join(values, ref_log_prob);                                 // waits; their tensors join the batch
//
// Each wait is timed under its stage's name in the step's metrics; what reaches the workers, in which
// order, is the same as a hand-written dispatch would send.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>

#include "hybridflow/algo/advantage.h"
#include "hybridflow/core/data_proto.h"

namespace hybridflow {

class TrainerStages;      // the trainer's side of a step (internal to trainer/)
struct RolloutBatchState;

// One generation of a step and what joins it: the generated rows (prompts, responses, masks), then
// scores, log-probs, values, advantages. A handle: copies refer to the same batch.
class RolloutBatch {
 public:
  RolloutBatch() = default;
  bool valid() const { return static_cast<bool>(state_); }
  int64_t n() const;               // samples per prompt; the rows of one prompt are consecutive
  DataProto& data();               // the rows, with every joined tensor (waits for the generation)
  const at::Tensor& scores() const;  // [rows] sequence scores, once reward.compute_reward has joined
  const at::Tensor& costs() const;   // [rows] sequence costs, once cost->compute_cost has joined
  // advantages and returns [rows, response] for the actor's update (and returns for the critic's).
  void set_advantages(const algo::AdvantageOutput& adv);
  // Safe-RLHF: the cost critic's returns (and cost_advantages/mean in the metrics).
  void set_cost_advantages(const algo::AdvantageOutput& cost_adv);

 private:
  friend class TrainerStages;
  explicit RolloutBatch(std::shared_ptr<RolloutBatchState> state) : state_(std::move(state)) {}
  std::shared_ptr<RolloutBatchState> state_;
};

// A dispatched call's result on its way. join() waits for it once and puts it where it belongs (a tensor
// into its batch, an update's metrics into the step's); later joins do nothing. A default-constructed
// Pending is nothing in flight (a role the run does not have), and joins as a no-op.
class Pending {
 public:
  Pending() = default;
  explicit Pending(std::function<void()> on_join)
      : on_join_(std::make_shared<std::function<void()>>(std::move(on_join))) {}
  bool valid() const { return on_join_ && *on_join_; }
  void join() {
    if (!valid()) return;
    auto on_join = std::move(*on_join_);
    *on_join_ = nullptr;
    on_join();
  }

 private:
  std::shared_ptr<std::function<void()>> on_join_;
};

// Joins each in the order given.
template <class... P>
void join(P&... pending) {
  (pending.join(), ...);
}

enum class Decoding {
  kSampled,  // actor_rollout_ref.rollout.n samples per prompt, at the rollout's temperature
  kGreedy,   // one greedy response per prompt (ReMax's baseline); not trained on
};

// What every handle holds: the step whose worker groups it calls. Only the trainer makes one.
class RoleHandle {
 public:
  explicit RoleHandle(TrainerStages& step) : step_(&step) {}

 protected:
  TrainerStages* step_;
};

// The actor with its rollout: generates (on the standalone rollout pool when placed there), computes the
// old policy's log-probs and trains.
class ActorRollout : public RoleHandle {
 public:
  using RoleHandle::RoleHandle;
  RolloutBatch generate_sequences(const DataProto& prompts, Decoding decoding = Decoding::kSampled);
  // old_log_probs: the policy that generated, before this step's update (with
  // algorithm.rollout_correction.bypass_mode the rollout's own log-probs, no call).
  Pending compute_log_prob(const RolloutBatch& batch);
  // The PPO update on the batch's advantages; then the new weights go to a standalone rollout pool.
  Pending update_actor(const RolloutBatch& batch);
};

// The frozen reference policy (hosted in the actor's processes): ref_log_prob for the KL terms.
class Reference : public RoleHandle {
 public:
  using RoleHandle::RoleHandle;
  Pending compute_log_prob(const RolloutBatch& batch);
};

// A value function: the critic (values, trained on returns) or Safe-RLHF's cost critic (cost_values,
// trained on the cost returns).
class Critic : public RoleHandle {
 public:
  Critic(TrainerStages& step, bool of_cost) : RoleHandle(step), of_cost_(of_cost) {}
  Pending compute_values(const RolloutBatch& batch);
  Pending update_critic(const RolloutBatch& batch);

 private:
  bool of_cost_;
};

// The sequence score: the rule reward (reward.type or the task's), plus the reward model when enabled,
// plus DAPO's overlong penalty when reward_model.overlong_buffer.enable. Only the reward model is a call.
class Reward : public RoleHandle {
 public:
  using RoleHandle::RoleHandle;
  Pending compute_reward(const RolloutBatch& batch);
};

// Safe-RLHF's sequence cost: the rule cost (cost.type) plus the cost model when enabled.
class Cost : public RoleHandle {
 public:
  using RoleHandle::RoleHandle;
  Pending compute_cost(const RolloutBatch& batch);
};

// The roles of the run. Those that the configuration leaves out are empty: a reference only with a KL term
// (actor.use_kl_loss or algorithm.use_kl_in_reward), a critic only with adv_estimator gae, the cost and
// cost critic only with a cost (cost_model.enable or cost.type; the cost critic with gae).
struct RLRoles {
  ActorRollout actor;
  std::optional<Reference> ref;
  std::optional<Critic> critic;
  Reward reward;
  std::optional<Cost> cost;
  std::optional<Critic> cost_critic;
};

}  // namespace hybridflow
