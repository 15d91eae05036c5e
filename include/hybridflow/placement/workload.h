// What one RL iteration asks of the models: the algorithm and its roles, the batch and sequence lengths,
// and the calls each role serves in the order the trainer's programs make them (src/trainer/programs/),
// with the data each call waits for. The simulator times these calls; the search places their roles.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace hybridflow::placement {

enum class Algorithm { kPPO, kGRPO, kReMax, kSafeRLHF };
// "ppo" | "grpo" | "remax" | "safe-rlhf"; anything else is an Error naming the four.
Algorithm parse_algorithm(const std::string& name);
std::string algorithm_name(Algorithm a);

// The models of an RL dataflow. The actor trains and the rollout generates with the actor's weights: in
// one set they are one worker switching layouts (3D-HybridEngine); apart, the rollout holds a shadow copy
// that is synchronised after every actor update (standalone rollout).
enum class Role { kActor, kRollout, kRef, kCritic, kRewardModel, kCostModel, kCostCritic };
std::string role_name(Role r);  // "actor", "rollout", "ref", "critic", "reward_model", "cost_model", "cost_critic"
bool trains(Role r);            // actor, critic, cost critic
bool has_value_head(Role r);    // critic, reward and cost models, cost critic

struct Workload {
  Algorithm algorithm = Algorithm::kPPO;
  bool reward_model = true;          // a learned reward model (GRPO may score with rules only)
  // A reference model: the trainer runs one (and its compute_ref_log_prob) only for a KL term,
  // actor_rollout_ref.actor.use_kl_loss or algorithm.use_kl_in_reward; without it no call or layout has one.
  bool reference = true;
  int64_t prompts = 1024;            // per batch (data.train_batch_size)
  int64_t samples_per_prompt = 1;    // actor_rollout_ref.rollout.n
  int64_t prompt_length = 1024;      // tokens, padded
  int64_t response_length = 1024;    // tokens generated per response (every response runs to the limit)
  int64_t ppo_epochs = 1;
  int64_t mini_batches = 1;          // optimizer steps per epoch
  int64_t train_micro_rows = 1;      // sequences per micro-batch per device in an update
  int64_t infer_micro_rows = 4;      // sequences per micro-batch per device in a forward-only pass
  double param_bytes = 2;            // 2 (bf16 weights, fp32 master and Adam moments) or 4 (fp32)
  bool distributed_optimizer = true;  // ZeRO-1: optimizer state partitioned over data-parallel ranks
  int staleness = 0;                 // standalone rollout: generate up to k steps ahead of its weights
  int sync_every = 1;                // weights synced every N actor updates (trigger_parameter_sync_step)
  int64_t max_num_seqs = 0;          // sequences a generation replica decodes at once (rollout.max_num_seqs); 0: as the KV cache allows

  std::vector<Role> roles() const;   // in a fixed order: actor, rollout, ref (if any), critic, reward model, ...
  int64_t sequences() const { return prompts * samples_per_prompt; }
  int64_t sequence_length() const { return prompt_length + response_length; }
  void validate() const;             // Error naming the first field out of range
};

enum class CallKind { kGenerate, kGenerateGreedy, kLogProb, kRefLogProb, kValues, kScore, kUpdate };
std::string call_name(CallKind k);  // the worker method: "generate_sequences", "compute_log_prob", ...

// The stage of the paper's three (generation, preparation, training) a call belongs to.
enum class Stage { kGeneration, kPreparation, kTraining };
std::string stage_name(Stage s);

struct Call {
  Role role;
  CallKind kind;
  Stage stage;
  std::vector<int> after;  // indices of the calls (of the same iteration) whose outputs it needs
  int64_t rows = 0;        // sequences it processes (prompts for a generation)
};

// The call as the trainer's timeline names it (worker group "." method): the rollout and the reference
// live in the actor's worker, so "actor.generate_sequences", "actor.compute_ref_log_prob", "critic.update_critic";
// a standalone rollout is a worker group of its own, "rollout.generate_sequences".
std::string timeline_name(const Call& call, bool standalone_rollout = false);

// One iteration's calls in program order. Generation calls need the actor's previous update, which the
// simulator adds across iterations.
std::vector<Call> iteration_calls(const Workload& w);

}  // namespace hybridflow::placement
