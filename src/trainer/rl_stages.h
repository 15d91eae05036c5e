// Internal to trainer/: the RLStages the trainer hands to an algorithm program for one step.
#pragma once

#include "hybridflow/trainer/rl_program.h"
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

class TrainerStages final : public RLStages {
 public:
  explicit TrainerStages(RLTrainer::State& s);

  const Config& config() const override;
  MetricsLog& metrics() override;
  int64_t step() const override;
  algo::LagrangeMultiplier& lagrange() override;
  DataProto next_prompts(int64_t count = 0) override;
  Generation generate(const DataProto& prompts, bool greedy = false) override;
  at::Tensor score(const Generation& generation) override;
  at::Tensor cost(const Generation& generation) override;
  Rollout rollout(const DataProto& prompts) override;
  Rollout rollout_of(const DataProto& generated, int64_t n, const at::Tensor& scores = {}) override;
  DataProto concat(const std::vector<DataProto>& generated) override;
  void score(Rollout& r) override;
  void cost(Rollout& r) override;
  void collect(Rollout& r) override;
  at::Tensor token_rewards(Rollout& r) override;
  algo::AdvantageInput advantage_input(const Rollout& r, const at::Tensor& token_rewards) override;
  algo::AdvantageOutput advantage(const std::string& estimator, const algo::AdvantageInput& in) override;
  void set_advantages(Rollout& r, const algo::AdvantageOutput& adv) override;
  void set_cost_advantages(Rollout& r, const algo::AdvantageOutput& cost_adv) override;
  void update(Rollout& r) override;
  nlohmann::json finish(Rollout& r) override;

  bool finished() const { return finished_; }  // the program ended its step with finish()

 private:
  const DataProto& wait_generation(const Future& batch);
  // A generate_sequences request for `prompts`, sampled with the seed of round `round` of step `step`.
  DataProto generation_request(const DataProto& prompts, int64_t step, uint64_t round) const;
  // The step's first sampled generation: with rollout.staleness 1 the one the previous step dispatched (and
  // the next step's is dispatched here); otherwise dispatched now.
  Future sampled_generation(const DataProto& prompts, uint64_t round);
  // Every sample carries the policy version that generated it; the actor's own rollouts are this step's.
  void stamp_policy_version(DataProto& batch) const;
  // Rule score + reward model + overlong penalty; `log` records the parts as this step's metrics.
  at::Tensor sequence_scores(const DataProto& gen, const Future& rm_score, bool log);
  at::Tensor sequence_costs(const DataProto& gen, const Future& cost_score);
  Rollout dispatch_readers(const Future& gen, int64_t n);
  // Watching the run (rl_stages_log.cpp): K decoded samples every trainer.log_samples_freq steps, and
  // the step's calls per pool; `step` is the number the step's metrics record gets.
  void log_samples(const Rollout& r, int64_t step);
  void log_timeline(int64_t step);

  RLTrainer::State& s_;
  StageTimer timer_;
  CallSpan::Clock::time_point step_start_;
  double step_start_unix_s_ = 0;
  uint64_t sampled_generations_ = 0;
  bool drew_prompts_ = false;  // next_prompts ran this step (the prefetched prompts go to the first call)
  std::optional<RLTrainer::State::WeightSyncCalls> weight_sync_;  // dispatched after the actor's update
  bool finished_ = false;
};

}  // namespace hybridflow
