#include "hybridflow/placement/trainer_support.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "hybridflow/core/error.h"
#include "trainer_placements.h"

namespace hybridflow::placement {

namespace {

bool holds(const std::vector<Role>& set, Role r) { return std::find(set.begin(), set.end(), r) != set.end(); }

// The pools of trainer.placement: split: the actor's (with its rollout and reference) and one with every
// other model.
bool split_preset(const std::vector<std::vector<Role>>& sets) {
  if (sets.size() != 2) return false;
  const auto& actor = holds(sets[0], Role::kActor) ? sets[0] : sets[1];
  const auto& other = holds(sets[0], Role::kActor) ? sets[1] : sets[0];
  return holds(actor, Role::kRollout) && std::all_of(actor.begin(), actor.end(), [](Role r) {
           return r == Role::kActor || r == Role::kRollout || r == Role::kRef;
         }) && !holds(other, Role::kRollout);
}

// The pools of trainer.placement: standalone: the rollout's alone and one with every other model.
bool standalone_preset(const std::vector<std::vector<Role>>& sets) {
  return sets.size() == 2 && ((sets[0].size() == 1 && sets[0][0] == Role::kRollout) ||
                              (sets[1].size() == 1 && sets[1][0] == Role::kRollout));
}

void emit(YAML::Emitter& out, const nlohmann::ordered_json& v) {
  if (v.is_object()) {
    out << YAML::BeginMap;
    for (const auto& [k, x] : v.items()) {
      out << YAML::Key << k << YAML::Value;
      emit(out, x);
    }
    out << YAML::EndMap;
  } else if (v.is_array()) {
    out << YAML::Flow << YAML::BeginSeq;
    for (const auto& x : v) emit(out, x);
    out << YAML::EndSeq;
  } else if (v.is_boolean()) {
    out << v.get<bool>();
  } else if (v.is_number_integer()) {
    out << v.get<int64_t>();
  } else {
    out << v.get<std::string>();
  }
}

}  // namespace

TrainerCapabilities TrainerCapabilities::today() { return {true, true, false}; }

TrainerCapabilities TrainerCapabilities::anything() { return {true, true, true, true}; }

std::string grouping_problem(const std::vector<std::vector<Role>>& sets, const TrainerCapabilities& caps) {
  const auto actor = std::find_if(sets.begin(), sets.end(), [](const auto& s) { return holds(s, Role::kActor); });
  const bool standalone = actor == sets.end() || !holds(*actor, Role::kRollout);
  if (standalone && !caps.standalone_rollout) return "the trainer runs the rollout only on the actor's processes";
  if (!caps.independent_layouts) {
    for (const auto& s : sets)
      if (holds(s, Role::kRef) && !holds(s, Role::kActor)) return "the reference lives in the actor's processes";
    // The trainer runs a cost critic in a pool of its own only with the critic's sizes; the search costs
    // them apart, so the planner keeps them together.
    for (const auto& s : sets)
      if (holds(s, Role::kCostCritic) && !holds(s, Role::kCritic)) return "the cost critic takes the critic's layout";
  }
  if (caps.any_pools || sets.size() == 1 || split_preset(sets) || (caps.standalone_rollout && standalone_preset(sets)))
    return "";
  return "without a pools: section the trainer colocates every role, splits the actor (with rollout and reference) "
         "from every other model, or puts the rollout alone";
}

namespace {

// Whether `role` of a mixture-of-experts model folds its experts over its tensor-parallel ranks
// (expert_model_parallel_size = tensor_model_parallel_size), as the memory estimate assumes.
bool folds_experts(const Plan& plan, const ModelShape* model, Role role) {
  const int tp = plan.layout(role).tp;
  return model != nullptr && model->moe.num_experts > 0 && tp > 1 && model->moe.num_experts % tp == 0;
}

}  // namespace

std::string trainer_cannot_run(const Plan& plan, const TrainerCapabilities& caps, const ModelShape* model) {
  std::vector<std::vector<Role>> sets;
  for (const auto& s : plan.sets) sets.push_back(s.roles);
  std::string why = grouping_problem(sets, caps);
  if (!why.empty()) return why;
  if (plan.staleness > 0 && !caps.standalone_rollout) return "staleness needs a standalone rollout";
  const bool standalone = plan.set_of(Role::kRollout) >= 0 && plan.set_of(Role::kRollout) != plan.set_of(Role::kActor);
  if (standalone && !caps.staged_standalone_rollout && plan.layout(Role::kRollout).pp != 1)
    return "a standalone rollout has no pipeline stages (p_g = 1)";
  if (!caps.independent_layouts) {
    auto same = [&](Role a, Role b) {
      return plan.set_of(b) < 0 || (plan.layout(a).tp == plan.layout(b).tp && plan.layout(a).pp == plan.layout(b).pp &&
                                    plan.layout(a).sp == plan.layout(b).sp);
    };
    if (!same(Role::kActor, Role::kRef)) return "the reference must be split like the actor";
    if (!same(Role::kCritic, Role::kCostCritic)) return "the cost critic must be split like the critic";
  }
  // ref.ulysses_sequence_parallel_size is the actor's or nothing (the reference runs on the actor's groups).
  if (plan.set_of(Role::kRef) >= 0 && plan.layout(Role::kRef).sp != plan.layout(Role::kActor).sp)
    return "the reference must split its sequences like the actor";
  return "";
}

std::string trainer_config_fragment(const Plan& plan, const Workload& w, const TrainerCapabilities& caps,
                                    const ModelShape* model) {
  const std::string why = trainer_cannot_run(plan, caps, model);
  HF_CHECK(why.empty(), "hybridflow train cannot run the plan ", plan.describe(), ": ", why);
  HF_CHECK(w.prompts % w.mini_batches == 0, "the plan's ", w.prompts, " prompts do not divide into ", w.mini_batches,
           " mini-batches (actor_rollout_ref.actor.ppo_mini_batch_size counts prompts)");
  std::vector<std::vector<Role>> sets;
  for (const auto& set : plan.sets) sets.push_back(set.roles);
  const bool colocate = sets.size() == 1;
  const bool standalone = plan.set_of(Role::kRollout) >= 0 && plan.set_of(Role::kRollout) != plan.set_of(Role::kActor);
  // A preset when the grouping is one, else a pools: section (whose pools size every role, so no
  // num_processes key is written).
  const std::string preset = colocate ? "colocate" : split_preset(sets) ? "split" : standalone_preset(sets) ? "standalone" : "";
  const std::string dtype = w.param_bytes == 2 ? "bf16" : "fp32";
  auto devices_of = [&](Role r) { return static_cast<int64_t>(plan.sets[static_cast<size_t>(plan.set_of(r))].devices); };
  auto megatron = [&](Role r, bool optimizer) {
    nlohmann::ordered_json m = {{"tensor_model_parallel_size", plan.layout(r).tp},
                                {"pipeline_model_parallel_size", plan.layout(r).pp}};
    if (optimizer && folds_experts(plan, model, r)) m["expert_model_parallel_size"] = plan.layout(r).tp;
    if (optimizer) m["use_distributed_optimizer"] = w.distributed_optimizer;
    return m;
  };
  const int64_t mini_batch = w.prompts / w.mini_batches;
  nlohmann::ordered_json f;
  if (!preset.empty()) f["trainer"] = {{"placement", preset}};
  f["data"] = {{"train_batch_size", w.prompts}, {"max_prompt_length", w.prompt_length}};
  nlohmann::ordered_json arr;
  if (!preset.empty()) arr["num_processes"] = devices_of(Role::kActor);
  arr["actor"] = {{"ppo_epochs", w.ppo_epochs},
                  {"ppo_mini_batch_size", mini_batch},
                  {"ppo_micro_batch_size_per_gpu", w.train_micro_rows},
                  {"dtype", dtype},
                  {"megatron", megatron(Role::kActor, true)}};
  if (plan.layout(Role::kActor).sp > 1) arr["actor"]["ulysses_sequence_parallel_size"] = plan.layout(Role::kActor).sp;
  nlohmann::ordered_json rollout = {{"n", w.samples_per_prompt},
                                    {"response_length", w.response_length},
                                    {"log_prob_micro_batch_size_per_gpu", w.infer_micro_rows},
                                    {"tensor_model_parallel_size", plan.layout(Role::kRollout).tp},
                                    {"pipeline_model_parallel_size", plan.layout(Role::kRollout).pp}};
  if (standalone) {
    if (preset == "standalone") rollout["num_processes"] = devices_of(Role::kRollout);
    rollout["staleness"] = plan.staleness;
    if (plan.sync_every > 1) rollout["trigger_parameter_sync_step"] = plan.sync_every;
  }
  arr["rollout"] = rollout;
  if (plan.set_of(Role::kRef) >= 0) arr["ref"] = {{"log_prob_micro_batch_size_per_gpu", w.infer_micro_rows}};
  f["actor_rollout_ref"] = arr;
  // split's second pool is sized by the critic's key, or without a critic the reward model's, else the cost
  // model's (placement_spec.cpp's preset_pools).
  const Role second_pool_key = plan.set_of(Role::kCritic) >= 0        ? Role::kCritic
                               : plan.set_of(Role::kRewardModel) >= 0 ? Role::kRewardModel
                                                                      : Role::kCostModel;
  auto sized_here = [&](Role r) { return preset == "split" && r == second_pool_key; };
  if (plan.set_of(Role::kCritic) >= 0) {
    nlohmann::ordered_json c;
    if (sized_here(Role::kCritic)) c["num_processes"] = devices_of(Role::kCritic);
    c["ppo_epochs"] = w.ppo_epochs;
    c["ppo_mini_batch_size"] = mini_batch;
    c["ppo_micro_batch_size_per_gpu"] = w.train_micro_rows;
    c["forward_micro_batch_size_per_gpu"] = w.infer_micro_rows;
    c["dtype"] = dtype;
    c["megatron"] = megatron(Role::kCritic, true);
    if (plan.layout(Role::kCritic).sp > 1) c["ulysses_sequence_parallel_size"] = plan.layout(Role::kCritic).sp;
    f["critic"] = c;
  }
  for (const auto& [role, section] : {std::pair{Role::kRewardModel, "reward_model"}, {Role::kCostModel, "cost_model"}}) {
    if (plan.set_of(role) < 0) continue;
    nlohmann::ordered_json m;
    if (sized_here(role)) m["num_processes"] = devices_of(role);
    m["micro_batch_size_per_gpu"] = w.infer_micro_rows;
    m["dtype"] = dtype;
    m["megatron"] = megatron(role, false);
    f[section] = m;
  }
  if (preset.empty()) {
    // Each pool named after its first role; the reference is not placed (it lives with the actor) and a
    // rollout in the actor's pool is the actor generating, so neither is listed.
    nlohmann::ordered_json pools;
    for (const auto& set : plan.sets) {
      nlohmann::ordered_json roles = nlohmann::ordered_json::array();
      const bool with_actor = std::find(set.roles.begin(), set.roles.end(), Role::kActor) != set.roles.end();
      for (Role r : set.roles)
        if (r != Role::kRef && !(r == Role::kRollout && with_actor)) roles.push_back(role_name(r));
      HF_CHECK(!roles.empty(), "the trainer places the reference only with the actor, not in a pool of its own");
      pools[roles.front().get<std::string>()] = {{"processes", static_cast<int64_t>(set.devices)}, {"roles", roles}};
    }
    f["pools"] = pools;
  }
  YAML::Emitter out;
  emit(out, f);
  std::string text = "# hybridflow plan: " + plan.placement_name() + " " + plan.describe() + "\n";
  if (plan.set_of(Role::kRewardModel) >= 0 || plan.set_of(Role::kCostModel) >= 0)
    text += "# the reward (and cost) model also need reward_model.enable: true and reward_model.path (cost_model.*)\n";
  // The fragment leaves the KL switches to the user's config: it only says when the plan's times assumed none.
  if (!w.reference)
    text += "# planned without a reference model: the times assume actor.use_kl_loss and algorithm.use_kl_in_reward "
            "are false\n";
  return text + out.c_str() + "\n";
}

}  // namespace hybridflow::placement
