// Internal to trainer/: the RLStep the trainer hands to an algorithm program for one step, and the role
// handles' work behind it.
#pragma once

#include <map>

#include "hybridflow/trainer/rl_program.h"
#include "hybridflow/trainer/step_records.h"
#include "rl_trainer_state.h"

namespace hybridflow {

// Work the controller does itself (rule scoring, advantages) as a span of pool "controller" in the
// step's timeline, beside the worker pools' calls. Usage: { ControllerSpan span(*s_.timeline, "advantage"); ... }
class ControllerSpan {
 public:
  ControllerSpan(CallTimeline& timeline, std::string what)
      : timeline_(timeline), what_(std::move(what)), start_(CallSpan::Clock::now()) {}
  ~ControllerSpan() { timeline_.add({"controller", "controller", what_, start_, CallSpan::Clock::now()}); }
  ControllerSpan(const ControllerSpan&) = delete;
  ControllerSpan& operator=(const ControllerSpan&) = delete;

 private:
  CallTimeline& timeline_;
  std::string what_;
  CallSpan::Clock::time_point start_;
};

// A generation and what has joined it (trainer/rl_roles.h's RolloutBatch is a handle to one).
struct RolloutBatchState {
  TrainerStages* step = nullptr;
  Future generation;      // the generate_sequences call (a ready one for a batch_of batch)
  bool greedy = false;    // a baseline: not trained on, so neither stamped nor its reshard logged
  bool waited = false;    // `data` holds the generation
  DataProto data;         // gains tensors as results join
  DataProto prompts;      // empty for a batch_of batch
  int64_t n = 1;
  at::Tensor scores, costs;
  std::map<std::string, double> score_metrics;  // score/* of the parts, logged if the step trains on it
  std::vector<int64_t> update_rows;  // algorithm.use_pf_ppo: the rows every update trains on, drawn once
};

// Row `row` of a generated batch as the run's records show it: the prompt row's text, answer and data source,
// `response` (decoded by the caller), its sampled tokens, its score (`scores`, when defined) and, once the step
// has them, its reward and mean advantage.
RolloutSample rollout_sample(const DataProto& batch, const at::Tensor& scores, int64_t row, std::string response);

class TrainerStages final : public RLStep {
 public:
  explicit TrainerStages(RLTrainer::State& s);

  // RLStep
  RLRoles& roles() override { return roles_; }
  const Config& config() const override;
  const RunSpec& spec() const override;
  MetricsLog& metrics() override;
  int64_t step() const override;
  const std::string& adv_estimator() const override;
  algo::LagrangeMultiplier& lagrange() override;
  DataProto next_prompts(int64_t count = 0) override;
  RolloutBatch batch_of(const DataProto& generated, int64_t n, const at::Tensor& scores = {}) override;
  DataProto concat(const std::vector<DataProto>& generated) override;
  algo::AdvantageInput advantage_input(RolloutBatch& batch) override;
  algo::AdvantageInput cost_advantage_input(RolloutBatch& batch) override;
  algo::AdvantageOutput advantage(const std::string& estimator, const algo::AdvantageInput& in) override;
  nlohmann::json finish(RolloutBatch& batch) override;

  bool finished() const { return finished_; }  // the program ended its step with finish()

  // What the role handles (rl_roles.cpp) dispatch: each returns at once.
  RolloutBatch generate(const DataProto& prompts, Decoding decoding);
  Pending old_log_prob(const RolloutBatch& batch);
  Pending ref_log_prob(const RolloutBatch& batch);
  Pending values(const RolloutBatch& batch, bool of_cost);
  Pending reward(const RolloutBatch& batch);
  Pending cost(const RolloutBatch& batch);
  Pending update_critic(const RolloutBatch& batch, bool of_cost);
  Pending update_actor(const RolloutBatch& batch);
  // The generated rows (waits for the generation the first time, timed as the step's generate stage).
  DataProto& wait_generation(RolloutBatchState& batch);
  static RolloutBatchState& state_of(const RolloutBatch& batch);

 private:
  // A generate_sequences request for `prompts`, sampled with the seed of round `round` of step `step`.
  DataProto generation_request(const DataProto& prompts, int64_t step, uint64_t round) const;
  // The step's first sampled generation: with rollout.staleness 1 the one the previous step dispatched (and
  // the next step's is dispatched here); otherwise dispatched now.
  Future sampled_generation(const DataProto& prompts, uint64_t round);
  // rollout.stream_groups on a standalone pool running ahead (staleness > 0): a step's request says so, and
  // once it is sent its prompts are published in the weight-sync store for the call queued before it.
  bool streams_groups() const;
  // Sends a step's first sampled generation; a streaming one carries the pending prompts (State::as_sent) and
  // its own are published in the weight-sync store.
  Future send_sampled(const DataProto& request, int64_t step);
  // Every sample carries the policy version that generated it; the actor's own rollouts are this step's.
  void stamp_policy_version(DataProto& batch) const;
  // Rule score + reward model + overlong penalty; the parts' metrics into `parts`.
  at::Tensor sequence_scores(const DataProto& gen, const Future& rm_score, std::map<std::string, double>& parts);
  at::Tensor sequence_costs(const DataProto& gen, const Future& cost_score);
  // Token-level rewards [rows, R]: each score at its sequence's last token, minus the KL penalty when
  // algorithm.use_kl_in_reward (the adaptive controller steps on this batch's KL).
  at::Tensor token_rewards(RolloutBatchState& b);
  // trainer.balance_batch: `request` (a call of `method` on `group`) with its rows reordered so that each
  // data-parallel rank's chunk holds a like number of tokens (engine/seqlen_balancing.h); verl's
  // global_seqlen/* metrics when `log_metrics`. As it was when the key is off or the group has one rank.
  DataProto balanced(const WorkerGroup& group, const std::string& method, DataProto request, bool log_metrics = false);
  // The order balanced() gives `request`'s rows; empty when it keeps them as they are.
  std::vector<int64_t> balanced_order(const WorkerGroup& group, const std::string& method, const DataProto& request,
                                      bool log_metrics);
  // A forward pass (`method` on `group`) over the batch's generated rows, balanced as the updates are: with
  // trainer.balance_batch and more than one data-parallel rank the generation is awaited and the rows go in
  // balanced order (`order`; in_batch_order puts the results back), else the call waits on the generation.
  struct BalancedCall {
    Future result;
    std::vector<int64_t> order;  // empty: rows in the batch's order
  };
  BalancedCall call_on_generation(WorkerGroup& group, const std::string& method, RolloutBatchState& b);
  static DataProto in_batch_order(const DataProto& result, const std::vector<int64_t>& order);
  // algorithm.use_pf_ppo: `request` (rows in the batch's order) as the rows the batch's updates train on, drawn
  // once per batch from its scores (algo/pf_ppo.h) with the pf_ppo/* metrics; as it was when the key is off.
  DataProto pf_ppo_resampled(RolloutBatchState& b, DataProto request);
  // An update's metrics into the step's; counts the roles whose update skipped a non-finite step.
  void add_update_metrics(const Future& update, const std::string& rename_prefix = "");
  // Watching the run (rl_stages_log.cpp): K decoded samples every trainer.log_samples_freq steps, every
  // row into trainer.rollout_data_dir, and the step's calls per pool; `step` is the number the step's metrics record gets.
  void log_samples(const RolloutBatchState& b, int64_t step);
  void dump_rollout(const RolloutBatchState& b, int64_t step);  // trainer.rollout_data_dir: every row
  void log_timeline(int64_t step);

  RLTrainer::State& s_;
  RLRoles roles_;
  StageTimer timer_;
  CallSpan::Clock::time_point step_start_;
  double step_start_unix_s_ = 0;
  uint64_t sampled_generations_ = 0;
  bool drew_prompts_ = false;  // next_prompts ran this step (the prefetched prompts go to the first call)
  std::optional<RLTrainer::State::WeightSyncCalls> weight_sync_;  // dispatched after the actor's update
  int updates_ = 0;            // role updates joined this step
  int nonfinite_updates_ = 0;  // of them, those that met a non-finite gradient norm and skipped the step
  bool finished_ = false;
};

}  // namespace hybridflow
