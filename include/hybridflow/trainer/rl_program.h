// An RL algorithm as a short program over worker groups (HybridFlow section 4, Figure 6). Each step the
// trainer runs the configured program once. The program calls the roles by name (trainer/rl_roles.h) and
// reads like the paper's pseudo-code; batching, futures, timing, metrics, held-out evaluation, logging and
// checkpoints happen around it, in the step it is given:
//
//   nlohmann::json ppo(RLStep& step) {
//     auto& [actor, ref, critic, reward, cost, cost_critic] = step.roles();
//     RolloutBatch batch = actor.generate_sequences(step.next_prompts());
//     Pending scores = reward.compute_reward(batch);             // all four dispatched on the generation
//     Pending old_log_prob = actor.compute_log_prob(batch);      // in flight, and run concurrently
//     Pending ref_log_prob = ref ? ref->compute_log_prob(batch) : Pending();
//     Pending values = critic->compute_values(batch);
//     join(scores, old_log_prob, ref_log_prob, values);
//     step.compute_advantage(batch, "gae");
//     Pending critic_updated = critic->update_critic(batch);     // both dispatched, then both joined
//     Pending actor_updated = actor.update_actor(batch);
//     join(critic_updated, actor_updated);
//     return step.finish(batch);
//   }
//
// The built-in programs (src/trainer/programs/) are the estimator program (registered as ppo, grpo, rloo,
// reinforce_plus_plus and policy_gradient), remax, safe_rlhf and dapo; docs/new_algorithm.md walks
// through writing another, and examples/custom_program.cpp registers one from outside the library.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "hybridflow/algo/advantage.h"
#include "hybridflow/algo/safe_rlhf.h"
#include "hybridflow/core/config.h"
#include "hybridflow/core/data_proto.h"
#include "hybridflow/trainer/rl_roles.h"
#include "hybridflow/trainer/run_spec.h"

namespace hybridflow {

class MetricsLog;

// One step of the run, as a program sees it.
class RLStep {
 public:
  virtual ~RLStep() = default;

  virtual RLRoles& roles() = 0;
  // The run's settings, typed and checked (trainer/run_spec.h): what the built-in programs read.
  virtual const RunSpec& spec() const = 0;
  // The whole configuration: for a program's own extra keys only (declare them in the schema with `+key=`
  // or an open map, check them in the program's RLProgramCheck). Keys a spec holds are read from spec().
  virtual const Config& config() const = 0;
  virtual MetricsLog& metrics() = 0;  // for a program's own metrics; the step logs the usual ones itself
  virtual int64_t step() const = 0;   // 0-based index of the step being run
  virtual const std::string& adv_estimator() const = 0;  // algorithm.adv_estimator
  // Safe-RLHF's multiplier (the run has one when a cost is configured); checkpointed with the run.
  virtual algo::LagrangeMultiplier& lagrange() = 0;

  // The next data.train_batch_size prompts (`count` others), in the data order of the run.
  virtual DataProto next_prompts(int64_t count = 0) = 0;
  // A batch the program generated and filtered itself (DAPO), to train on like a generation: n samples per
  // prompt, and with `scores` already scored (reward.compute_reward then joins as a no-op).
  virtual RolloutBatch batch_of(const DataProto& generated, int64_t n, const at::Tensor& scores = {}) = 0;
  // Joins generated batches whose prompts were padded to different widths (left-pads to the widest).
  virtual DataProto concat(const std::vector<DataProto>& generated) = 0;

  // The estimator's input from a scored batch: token-level rewards (each score at its sequence's last
  // token, minus kl_coef x KL(actor || ref) per token when algorithm.use_kl_in_reward, which steps the
  // adaptive KL controller: call once per step), gamma, lam and the other `algorithm` settings, the mask,
  // the prompt index of every row and the critic's values.
  virtual algo::AdvantageInput advantage_input(RolloutBatch& batch) = 0;
  // The same for Safe-RLHF's costs, with the cost critic's values.
  virtual algo::AdvantageInput cost_advantage_input(RolloutBatch& batch) = 0;
  // The estimator registered under `estimator` (algo/advantage.h), timed as the step's advantage stage.
  virtual algo::AdvantageOutput advantage(const std::string& estimator, const algo::AdvantageInput& in) = 0;
  // compute_advantage of the paper: the batch's advantages and returns by `estimator`.
  void compute_advantage(RolloutBatch& batch, const std::string& estimator) {
    batch.set_advantages(advantage(estimator, advantage_input(batch)));
  }

  // Ends the step on the batch it trained on: its metrics, held-out score every trainer.test_freq steps,
  // the metrics line, the weight sync to a standalone rollout pool and a checkpoint every
  // trainer.save_freq steps. Returns the step's metrics record; a program's last line.
  virtual nlohmann::json finish(RolloutBatch& batch) = 0;
};

using RLProgram = std::function<nlohmann::json(RLStep&)>;
// What a program needs of the configuration, checked when the trainer is built (before any worker starts):
// throws hybridflow::Error naming the key.
using RLProgramCheck = std::function<void(const Config&)>;

// Adds (or replaces) a program under `name`; `algorithm.program: <name>` selects it.
void register_rl_program(const std::string& name, RLProgram program, RLProgramCheck check = {});
// Throws hybridflow::Error naming the known programs.
const RLProgram& get_rl_program(const std::string& name);
std::vector<std::string> rl_program_names();
// Runs the check registered with program `name` on `config`.
void check_rl_program(const std::string& name, const Config& config);

// The program a config runs: algorithm.program, or for `auto` safe_rlhf when a cost is configured
// (cost_model.enable or cost.type), dapo when algorithm.filter_groups.enable, else the program named
// like algorithm.adv_estimator (gae runs ppo; an estimator without a program of that name runs
// policy_gradient).
std::string rl_program_name(const Config& config);

}  // namespace hybridflow
