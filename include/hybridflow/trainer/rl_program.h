// An RL algorithm as a short program over worker groups (HybridFlow section 4, Figure 6). Each step the
// trainer runs the configured program once; the program reads like the paper's pseudo-code because the
// stages below hide batching, futures, timing, metrics and checkpoints:
//
//   nlohmann::json grpo(RLStages& rl) {
//     Rollout r = rl.rollout(rl.next_prompts());  // generate; log-probs, rewards dispatched on it
//     rl.score(r);                                // rule reward + reward model, per sequence
//     rl.collect(r);                              // old (and reference) log-probs into the batch
//     algo::AdvantageInput in = rl.advantage_input(r, rl.token_rewards(r));
//     rl.set_advantages(r, rl.advantage("grpo", in));
//     rl.update(r);                               // actor (and critics) in one dispatch
//     return rl.finish(r);
//   }
//
// The built-in programs (src/trainer/programs/) are ppo, grpo, rloo, remax, reinforce_plus_plus,
// safe_rlhf and dapo; docs/new_algorithm.md walks through writing another, and
// examples/custom_algorithm/ registers one from outside the library.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "hybridflow/algo/advantage.h"
#include "hybridflow/algo/safe_rlhf.h"
#include "hybridflow/core/config.h"
#include "hybridflow/core/data_proto.h"
#include "hybridflow/runtime/future.h"

namespace hybridflow {

class MetricsLog;

// A generation in flight and the scorers dispatched on it (the reward and cost models, when running).
struct Generation {
  Future batch;  // the generate_sequences result: prompts, responses, masks, per-sample fields
  Future rm_score, cost_score;
};

// One step's rollout as it flows through the stages. `batch` gains tensors as stages complete:
// old_log_probs, ref_log_prob, values, cost_values (collect), token_level_rewards (token_rewards),
// advantages and returns (set_advantages), cost_returns (set_cost_advantages).
struct Rollout {
  DataProto prompts;
  DataProto batch;
  int64_t n = 1;                 // samples per prompt; rows of one prompt are consecutive
  at::Tensor scores;             // [rows] sequence scores (score)
  at::Tensor costs;              // [rows] Safe-RLHF sequence costs (cost)
  Future rm_score, cost_score;   // pending scorers
  Future old_log_prob, ref_log_prob, values, cost_values;  // pending workers
};

// The stages a program is written in. Every stage that waits for a worker times itself under its name
// in the step's timing metrics.
class RLStages {
 public:
  virtual ~RLStages() = default;

  virtual const Config& config() const = 0;
  virtual MetricsLog& metrics() = 0;
  virtual int64_t step() const = 0;  // 0-based index of the step being run
  // Safe-RLHF's multiplier (an Error when no cost is configured); checkpointed with the run.
  virtual algo::LagrangeMultiplier& lagrange() = 0;

  // The next data.train_batch_size prompts (`count` others), in the data order of the run.
  virtual DataProto next_prompts(int64_t count = 0) = 0;
  // Dispatches generation of rollout.n samples per prompt (greedy: one greedy response each) and the
  // reward / cost models on its result. Returns at once.
  virtual Generation generate(const DataProto& prompts, bool greedy = false) = 0;
  // Sequence scores of a generation: the rule reward plus the reward model's score, plus DAPO's overlong
  // penalty when reward_model.overlong_buffer.enable (waits for the generation).
  virtual at::Tensor score(const Generation& generation) = 0;
  // Sequence costs of a generation: the rule cost plus the cost model's score.
  virtual at::Tensor cost(const Generation& generation) = 0;

  // Generation of `prompts` plus everything that reads it, dispatched at once (old log-probs; reference
  // log-probs with a KL term; values with a critic; reward and cost models), then waits for the generation.
  virtual Rollout rollout(const DataProto& prompts) = 0;
  // The same dispatch for a batch already generated (and, for DAPO, already filtered). With `scores` the
  // rollout comes scored: the reward model does not run again and score(r) only logs.
  virtual Rollout rollout_of(const DataProto& generated, int64_t n, const at::Tensor& scores = {}) = 0;
  // Joins generated batches whose prompts were padded to different widths (left-pads to the widest).
  virtual DataProto concat(const std::vector<DataProto>& generated) = 0;
  virtual void score(Rollout& r) = 0;  // r.scores (unless set); logs score/*
  virtual void cost(Rollout& r) = 0;   // r.costs; logs cost/mean
  virtual void collect(Rollout& r) = 0;  // waits for the log-probs and values into r.batch

  // Token-level rewards [rows, R]: each score at its sequence's last token, minus kl_coef x KL(actor || ref)
  // per token when algorithm.use_kl_in_reward (the adaptive controller steps on this batch's KL).
  virtual at::Tensor token_rewards(Rollout& r) = 0;
  // gamma, lam, norm_adv_by_std_in_grpo from `algorithm`, the rewards, mask, group index and values.
  virtual algo::AdvantageInput advantage_input(const Rollout& r, const at::Tensor& token_rewards) = 0;
  // The estimator registered under `estimator` (algo/advantage.h), timed as the step's advantage stage.
  virtual algo::AdvantageOutput advantage(const std::string& estimator, const algo::AdvantageInput& in) = 0;
  virtual void set_advantages(Rollout& r, const algo::AdvantageOutput& adv) = 0;
  // Safe-RLHF: cost returns for the cost critic.
  virtual void set_cost_advantages(Rollout& r, const algo::AdvantageOutput& cost_adv) = 0;

  // Dispatches the critic, cost critic (when running) and actor updates together and waits for all.
  virtual void update(Rollout& r) = 0;
  // Step metrics, held-out score every trainer.test_freq steps, the metrics line and a checkpoint every
  // trainer.save_freq steps. Returns the step's metrics record.
  virtual nlohmann::json finish(Rollout& r) = 0;
};

using RLProgram = std::function<nlohmann::json(RLStages&)>;

// Adds (or replaces) a program under `name`; `algorithm.program: <name>` selects it.
void register_rl_program(const std::string& name, RLProgram program);
// Throws hybridflow::Error naming the known programs.
const RLProgram& get_rl_program(const std::string& name);
std::vector<std::string> rl_program_names();

// The program a config runs: algorithm.program, or for `auto` safe_rlhf when a cost is configured
// (cost_model.enable or cost.type), dapo when algorithm.filter_groups.enable, else the program named
// like algorithm.adv_estimator (gae runs ppo).
std::string rl_program_name(const Config& config);

}  // namespace hybridflow
