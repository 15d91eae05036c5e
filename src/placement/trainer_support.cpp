#include "hybridflow/placement/trainer_support.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "hybridflow/core/error.h"
#include "trainer_placements.h"

namespace hybridflow::placement {

namespace {

bool holds(const std::vector<Role>& set, Role r) { return std::find(set.begin(), set.end(), r) != set.end(); }

// The pools `trainer.colocate: false` makes: the actor's (with its rollout and reference), the critic's
// (with the cost critic), the reward model's, the cost model's.
bool today_split_pool(const std::vector<Role>& set) {
  auto only = [&](std::initializer_list<Role> allowed) {
    return std::all_of(set.begin(), set.end(), [&](Role r) { return std::find(allowed.begin(), allowed.end(), r) != allowed.end(); });
  };
  if (holds(set, Role::kActor)) return only({Role::kActor, Role::kRollout, Role::kRef});
  if (holds(set, Role::kCritic)) return only({Role::kCritic, Role::kCostCritic});
  return set.size() == 1 && (set[0] == Role::kRewardModel || set[0] == Role::kCostModel);
}

void emit(YAML::Emitter& out, const nlohmann::ordered_json& v) {
  if (v.is_object()) {
    out << YAML::BeginMap;
    for (const auto& [k, x] : v.items()) {
      out << YAML::Key << k << YAML::Value;
      emit(out, x);
    }
    out << YAML::EndMap;
  } else if (v.is_boolean()) {
    out << v.get<bool>();
  } else if (v.is_number_integer()) {
    out << v.get<int64_t>();
  } else {
    out << v.get<std::string>();
  }
}

}  // namespace

TrainerCapabilities TrainerCapabilities::today() { return {}; }

TrainerCapabilities TrainerCapabilities::anything() { return {true, true, true}; }

std::string grouping_problem(const std::vector<std::vector<Role>>& sets, const TrainerCapabilities& caps) {
  const auto actor = std::find_if(sets.begin(), sets.end(), [](const auto& s) { return holds(s, Role::kActor); });
  const bool standalone = actor == sets.end() || !holds(*actor, Role::kRollout);
  if (standalone && !caps.standalone_rollout) return "the trainer runs the rollout only on the actor's processes";
  if (!caps.independent_layouts) {
    for (const auto& s : sets) {
      if (holds(s, Role::kRef) && !holds(s, Role::kActor)) return "the reference lives in the actor's processes";
      if (holds(s, Role::kCostCritic) && !holds(s, Role::kCritic)) return "the cost critic lives in the critic's processes";
    }
  }
  if (caps.any_pools || sets.size() == 1) return "";
  for (const auto& s : sets) {
    if (standalone && s.size() == 1 && s[0] == Role::kRollout) continue;
    if (!today_split_pool(s))
      return "without a pools: section the trainer colocates every role or gives the actor (with rollout and "
             "reference), the critic (with the cost critic), the reward model and the cost model a pool each";
  }
  return "";
}

std::string trainer_cannot_run(const Plan& plan, const TrainerCapabilities& caps) {
  std::vector<std::vector<Role>> sets;
  for (const auto& s : plan.sets) sets.push_back(s.roles);
  std::string why = grouping_problem(sets, caps);
  if (!why.empty()) return why;
  if (plan.staleness > 0 && !caps.standalone_rollout) return "staleness needs a standalone rollout";
  if (!caps.independent_layouts) {
    auto same = [&](Role a, Role b) {
      return plan.set_of(b) < 0 || (plan.layout(a).tp == plan.layout(b).tp && plan.layout(a).pp == plan.layout(b).pp);
    };
    if (!same(Role::kActor, Role::kRef)) return "the reference must be split like the actor";
    if (!same(Role::kCritic, Role::kCostCritic)) return "the cost critic must be split like the critic";
  }
  return "";
}

std::string trainer_config_fragment(const Plan& plan, const Workload& w, const TrainerCapabilities& caps) {
  const std::string why = trainer_cannot_run(plan, caps);
  HF_CHECK(why.empty(), "hybridflow train cannot run the plan ", plan.describe(), ": ", why);
  // Placements beyond today's keys (trainer.placement, pools:, rollout.staleness) are written by the code that
  // teaches the trainer them: here only trainer.colocate and each pool's num_processes exist.
  HF_CHECK(!caps.any_pools && !caps.standalone_rollout, "the config fragment knows only trainer.colocate; a pools: "
           "section or a standalone rollout needs the trainer that reads them");
  HF_CHECK(w.prompts % w.mini_batches == 0, "the plan's ", w.prompts, " prompts do not divide into ", w.mini_batches,
           " mini-batches (actor_rollout_ref.actor.ppo_mini_batch_size counts prompts)");
  const bool colocate = plan.sets.size() == 1;
  const std::string dtype = w.param_bytes == 2 ? "bf16" : "fp32";
  auto devices_of = [&](Role r) { return static_cast<int64_t>(plan.sets[static_cast<size_t>(plan.set_of(r))].devices); };
  auto megatron = [&](Role r, bool optimizer) {
    nlohmann::ordered_json m = {{"tensor_model_parallel_size", plan.layout(r).tp},
                                {"pipeline_model_parallel_size", plan.layout(r).pp}};
    if (optimizer) m["use_distributed_optimizer"] = w.distributed_optimizer;
    return m;
  };
  const int64_t mini_batch = w.prompts / w.mini_batches;
  nlohmann::ordered_json f;
  f["trainer"] = {{"colocate", colocate}};
  f["data"] = {{"train_batch_size", w.prompts}, {"max_prompt_length", w.prompt_length}};
  nlohmann::ordered_json arr;
  arr["num_processes"] = devices_of(Role::kActor);
  arr["actor"] = {{"ppo_epochs", w.ppo_epochs},
                  {"ppo_mini_batch_size", mini_batch},
                  {"ppo_micro_batch_size_per_gpu", w.train_micro_rows},
                  {"dtype", dtype},
                  {"megatron", megatron(Role::kActor, true)}};
  arr["rollout"] = {{"n", w.samples_per_prompt},
                    {"response_length", w.response_length},
                    {"log_prob_micro_batch_size_per_gpu", w.infer_micro_rows},
                    {"tensor_model_parallel_size", plan.layout(Role::kRollout).tp},
                    {"pipeline_model_parallel_size", plan.layout(Role::kRollout).pp}};
  arr["ref"] = {{"log_prob_micro_batch_size_per_gpu", w.infer_micro_rows}};
  f["actor_rollout_ref"] = arr;
  if (plan.set_of(Role::kCritic) >= 0) {
    nlohmann::ordered_json c;
    if (!colocate) c["num_processes"] = devices_of(Role::kCritic);
    c["ppo_epochs"] = w.ppo_epochs;
    c["ppo_mini_batch_size"] = mini_batch;
    c["ppo_micro_batch_size_per_gpu"] = w.train_micro_rows;
    c["forward_micro_batch_size_per_gpu"] = w.infer_micro_rows;
    c["dtype"] = dtype;
    c["megatron"] = megatron(Role::kCritic, true);
    f["critic"] = c;
  }
  for (const auto& [role, section] : {std::pair{Role::kRewardModel, "reward_model"}, {Role::kCostModel, "cost_model"}}) {
    if (plan.set_of(role) < 0) continue;
    nlohmann::ordered_json m;
    if (!colocate) m["num_processes"] = devices_of(role);
    m["micro_batch_size_per_gpu"] = w.infer_micro_rows;
    m["dtype"] = dtype;
    m["megatron"] = megatron(role, false);
    f[section] = m;
  }
  YAML::Emitter out;
  emit(out, f);
  std::string text = "# hybridflow plan: " + plan.placement_name() + " " + plan.describe() + "\n";
  if (plan.set_of(Role::kRewardModel) >= 0 || plan.set_of(Role::kCostModel) >= 0)
    text += "# the reward (and cost) model also need reward_model.enable: true and reward_model.path (cost_model.*)\n";
  return text + out.c_str() + "\n";
}

}  // namespace hybridflow::placement
