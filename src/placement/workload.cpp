#include "hybridflow/placement/workload.h"

#include <algorithm>

#include "hybridflow/core/error.h"

namespace hybridflow::placement {

Algorithm parse_algorithm(const std::string& name) {
  if (name == "ppo") return Algorithm::kPPO;
  if (name == "grpo") return Algorithm::kGRPO;
  if (name == "remax") return Algorithm::kReMax;
  if (name == "safe-rlhf") return Algorithm::kSafeRLHF;
  HF_FAIL("unknown algorithm '", name, "'; expected ppo, grpo, remax or safe-rlhf");
}

std::string algorithm_name(Algorithm a) {
  switch (a) {
    case Algorithm::kPPO: return "ppo";
    case Algorithm::kGRPO: return "grpo";
    case Algorithm::kReMax: return "remax";
    case Algorithm::kSafeRLHF: return "safe-rlhf";
  }
  return "?";
}

std::string role_name(Role r) {
  switch (r) {
    case Role::kActor: return "actor";
    case Role::kRollout: return "rollout";
    case Role::kRef: return "ref";
    case Role::kCritic: return "critic";
    case Role::kRewardModel: return "reward_model";
    case Role::kCostModel: return "cost_model";
    case Role::kCostCritic: return "cost_critic";
  }
  return "?";
}

bool trains(Role r) { return r == Role::kActor || r == Role::kCritic || r == Role::kCostCritic; }

bool has_value_head(Role r) {
  return r == Role::kCritic || r == Role::kRewardModel || r == Role::kCostModel || r == Role::kCostCritic;
}

std::vector<Role> Workload::roles() const {
  std::vector<Role> r = {Role::kActor, Role::kRollout};
  if (reference) r.push_back(Role::kRef);
  const bool critic = algorithm == Algorithm::kPPO || algorithm == Algorithm::kSafeRLHF;
  if (critic) r.push_back(Role::kCritic);
  if (reward_model) r.push_back(Role::kRewardModel);
  if (algorithm == Algorithm::kSafeRLHF) {
    r.push_back(Role::kCostModel);
    r.push_back(Role::kCostCritic);
  }
  return r;
}

void Workload::validate() const {
  for (const auto& [field, value] :
       {std::pair<const char*, int64_t>{"prompts (--batch)", prompts}, {"samples per prompt", samples_per_prompt},
        {"prompt length", prompt_length}, {"response length", response_length}, {"ppo epochs", ppo_epochs},
        {"mini-batches", mini_batches}, {"train micro-batch rows", train_micro_rows},
        {"inference micro-batch rows", infer_micro_rows}})
    HF_CHECK(value >= 1, "workload: ", field, " must be at least 1, got ", value);
  HF_CHECK(param_bytes == 2 || param_bytes == 4, "workload: parameter bytes must be 2 (bf16) or 4 (fp32), got ",
           param_bytes);
  HF_CHECK(staleness >= 0, "workload: staleness must be at least 0, got ", staleness);
  HF_CHECK(max_num_seqs == 0 || max_num_seqs >= samples_per_prompt, "workload: --max-num-seqs must be 0 (as many as ",
           "the KV cache holds) or at least the samples per prompt (", samples_per_prompt, "), got ", max_num_seqs);
  HF_CHECK(sync_every >= 1 && sync_every <= staleness + 1, "workload: weight syncs every N updates (--sync-every, trigger_parameter_sync_step) need 1 <= N <= ",
           "staleness + 1 = ", staleness + 1, ", got ", sync_every);
  HF_CHECK(sequences() % mini_batches == 0, "workload: ", sequences(), " sequences do not divide into ", mini_batches,
           " mini-batches");
  HF_CHECK(algorithm != Algorithm::kSafeRLHF || reward_model, "workload: safe-rlhf needs its reward model");
}

std::string call_name(CallKind k) {
  switch (k) {
    case CallKind::kGenerate: return "generate_sequences";
    case CallKind::kGenerateGreedy: return "generate_sequences(greedy)";
    case CallKind::kLogProb: return "compute_log_prob";
    case CallKind::kRefLogProb: return "compute_ref_log_prob";
    case CallKind::kValues: return "compute_values";
    case CallKind::kScore: return "compute_rm_score";
    case CallKind::kUpdate: return "update";
  }
  return "?";
}

std::string timeline_name(const Call& call, bool standalone_rollout) {
  const Role worker = (call.role == Role::kRollout && !standalone_rollout) || call.role == Role::kRef ? Role::kActor : call.role;
  std::string method = call.kind == CallKind::kGenerateGreedy ? "generate_sequences" : call_name(call.kind);
  if (call.kind == CallKind::kUpdate) method = worker == Role::kActor ? "update_actor" : "update_critic";
  return role_name(worker) + "." + method;
}

std::string stage_name(Stage s) {
  switch (s) {
    case Stage::kGeneration: return "generation";
    case Stage::kPreparation: return "preparation";
    case Stage::kTraining: return "training";
  }
  return "?";
}

// The order of src/trainer/programs/ and rl_stages.cpp: the generation (ReMax: the greedy baseline first,
// scored by the reward model), the reward and cost models on the rollout, then the actor's old and the
// reference's log-probs and the critics' values, then the critics' and the actor's updates.
std::vector<Call> iteration_calls(const Workload& w) {
  std::vector<Call> calls;
  const auto roles = w.roles();
  auto has = [&](Role r) { return std::find(roles.begin(), roles.end(), r) != roles.end(); };
  const int64_t seqs = w.sequences();
  if (w.algorithm == Algorithm::kReMax) {
    calls.push_back({Role::kRollout, CallKind::kGenerateGreedy, Stage::kGeneration, {}, w.prompts});
    if (has(Role::kRewardModel)) calls.push_back({Role::kRewardModel, CallKind::kScore, Stage::kPreparation, {0}, w.prompts});
  }
  const int gen = static_cast<int>(calls.size());
  calls.push_back({Role::kRollout, CallKind::kGenerate, Stage::kGeneration, {}, seqs});
  for (const auto& [role, kind] : {std::pair{Role::kRewardModel, CallKind::kScore}, {Role::kCostModel, CallKind::kScore},
                                   {Role::kActor, CallKind::kLogProb}, {Role::kRef, CallKind::kRefLogProb},
                                   {Role::kCritic, CallKind::kValues}, {Role::kCostCritic, CallKind::kValues}})
    if (has(role)) calls.push_back({role, kind, Stage::kPreparation, {gen}, seqs});
  std::vector<int> prepared;
  for (int i = 0; i < static_cast<int>(calls.size()); ++i)
    if (calls[i].stage == Stage::kPreparation) prepared.push_back(i);
  for (Role role : {Role::kCritic, Role::kCostCritic, Role::kActor})
    if (has(role)) calls.push_back({role, CallKind::kUpdate, Stage::kTraining, prepared, seqs});
  return calls;
}

}  // namespace hybridflow::placement
