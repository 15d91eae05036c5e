// RL post-training on a single controller (HybridFlow Figure 6, verl's RayPPOTrainer). The trainer
// builds the data, the scorers and the worker groups of each role (actor with rollout and reference;
// critic for adv_estimator gae; reward and cost models when enabled), then each step runs the configured
// algorithm program once (trainer/rl_program.h; the built-ins are one file each in src/trainer/programs/:
// ppo, grpo, rloo, remax, reinforce_plus_plus, safe_rlhf, dapo). Metrics go to the console and
// <run_dir>/metrics.jsonl; checkpoints to <run_dir>/checkpoints. Config keys follow verl
// (rl_trainer_defaults_yaml, docs/configuration.md).
// Worker processes re-execute the current binary: it must call register_rl_workers() and then
// run_worker_if_requested() first thing (see workers/rl_workers.h).
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "hybridflow/core/config.h"
#include "hybridflow/trainer/run_spec.h"

namespace hybridflow {

// The schema with defaults of an RL run's config (all sections: trainer, data, model, actor_rollout_ref,
// critic, reward_model, reward, algorithm).
std::string rl_trainer_defaults_yaml();

// Loads a user's YAML over the defaults, then applies key=value overrides.
Config load_rl_config(const std::string& user_file, const std::vector<std::string>& overrides);

// The run's settings (trainer/run_spec.h) that RLTrainer builds from `config`, with their checks: for a
// caller that needs one before the trainer starts (`hybridflow train --dashboard`: the run directory).
RunSpec rl_run_spec(const Config& config);

// Tokens generated per response: actor_rollout_ref.rollout.response_length when set, else verl's
// data.max_response_length (verl's rollout.response_length defaults to it the same way).
int64_t rl_response_length(const Config& config);

class TrainerStages;  // the stages a step's program runs in (src/trainer/rl_stages.h)

class RLTrainer {
 public:
  // Builds the data and tokenizer, starts the worker pools and creates the worker groups. Error on a bad config.
  explicit RLTrainer(const Config& config);
  ~RLTrainer();
  // `hybridflow train --check`: every check the trainer makes before it starts a process (keys and values, the
  // data files read and encoded, the model's config.json and tokenizer, the placement, each role's spec, batch
  // sizes and context length), without creating the run directory or starting a worker. Returns what the run
  // would be: program, estimator, device, model, prompts, steps, placement and the checkpoint it would resume.
  static nlohmann::json check(const Config& config);
  RLTrainer(const RLTrainer&) = delete;
  RLTrainer& operator=(const RLTrainer&) = delete;

  // One step of the algorithm program; returns the metrics record written to metrics.jsonl. Saves a
  // checkpoint after every trainer.save_freq-th step.
  nlohmann::json step();
  // Runs the steps left up to trainer.total_steps with a progress line per step; saves a checkpoint at the
  // end when trainer.save_checkpoint is set or save_freq > 0. Returns the last step's metrics (null when
  // a resumed run had no steps left).
  nlohmann::json fit();
  // Writes <run_dir>/checkpoints/step_<N> now (see trainer/checkpoint.h); returns its directory.
  std::string save_checkpoint();
  // Mean task score of greedy responses to `count` held-out prompts (the policy's accuracy).
  double evaluate(int64_t count);
  // verl's val_before_train: evaluate(count) before the first step. A run that has taken no step yet also logs
  // it as the metrics record of step 0 (val/score and the val-core/* of a test_freq step), where verl's loggers
  // put it, so the held-out curve starts from the untrained policy; a resumed run only returns it.
  double validate_before_training(int64_t count);

  // Names of the worker groups started, e.g. {"actor", "critic"} ("rollout" last, when standalone).
  std::vector<std::string> roles() const;
  int64_t steps_done() const;
  // The run's settings as the trainer read them (trainer/run_spec.h).
  const RunSpec& spec() const;
  // The checkpoint this run continued from (trainer.resume_mode / resume_from_path); "" for a fresh start.
  const std::string& resumed_from() const;
  // The newest checkpoint written (or resumed from); "" when none.
  const std::string& last_checkpoint() const;
  // Sum of squared parameters of a role's model ("actor", "critic", "cost_critic" or a standalone
  // "rollout"'s shadow copy): tells whether an update changed it, or a weight sync delivered it.
  double parameter_sq_norm(const std::string& role);

 private:
  friend class TrainerStages;
  struct State;
  std::unique_ptr<State> s_;
};

// `hybridflow train`: load nothing more, run fit(), print a summary. Returns a process exit code.
int run_rl_training(const Config& config);

}  // namespace hybridflow
