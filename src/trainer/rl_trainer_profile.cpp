// global_profiler (verl's keys, tool torch): each profiled step arms the worker groups whose roles have their
// profiler enabled at its start and disarms them at its end (runtime/call_profiler.h), so every call the
// controller dispatched to them in that step runs under libtorch's profiler on the chosen ranks.
#include "rl_trainer_state.h"

#include "hybridflow/runtime/call_profiler.h"

namespace hybridflow {

namespace {

// A role's profiler section as the methods it covers on one group: none when the section is off.
void add_target(std::vector<CallProfileRequest::Target>& targets, const ProfilerRunSpec::Role& role,
                const std::string& section, const WorkerGroup& group, std::set<std::string> methods) {
  if (!role.enable) return;
  for (int rank : role.ranks)
    HF_CHECK(role.all_ranks || rank < group.world_size(), section, ".profiler.ranks: rank ", rank, " is out of range: ",
             "role '", group.role(), "' has ", group.world_size(), " rank", group.world_size() == 1 ? "" : "s");
  CallProfileRequest::Target t;
  for (const std::string& m : methods)
    if (group.methods().count(m)) t.methods.insert(m);
  if (t.methods.empty()) return;
  t.all_ranks = role.all_ranks;
  t.ranks.insert(role.ranks.begin(), role.ranks.end());
  t.contents = role.contents;
  targets.push_back(std::move(t));
}

}  // namespace

std::vector<std::pair<WorkerGroup*, std::vector<CallProfileRequest::Target>>> RLTrainer::State::profile_targets()
    const {
  const ProfilerRunSpec& p = run.profiler;
  std::vector<std::pair<WorkerGroup*, std::vector<CallProfileRequest::Target>>> out;
  auto add = [&](WorkerGroup* group, auto&& fill) {
    if (group == nullptr) return;
    std::vector<CallProfileRequest::Target> targets;
    fill(*group, targets);
    if (!targets.empty()) out.emplace_back(group, std::move(targets));
  };
  add(actor.get(), [&](const WorkerGroup& g, auto& t) {
    add_target(t, p.actor, "actor_rollout_ref.actor", g, {"update_actor", "compute_log_prob", "send_weights"});
    if (!rollout) add_target(t, p.rollout, "actor_rollout_ref.rollout", g, {"generate_sequences"});
    add_target(t, p.ref, "actor_rollout_ref.ref", g, {"compute_ref_log_prob"});
  });
  add(rollout.get(), [&](const WorkerGroup& g, auto& t) {
    add_target(t, p.rollout, "actor_rollout_ref.rollout", g, {"generate_sequences", "receive_weights"});
  });
  // Safe-RLHF's cost critic and cost model take the critic's and the reward model's sections.
  for (WorkerGroup* g : {critic.get(), cost_critic.get()})
    add(g, [&](const WorkerGroup& group, auto& t) {
      add_target(t, p.critic, "critic", group, {"compute_values", "update_critic"});
    });
  for (WorkerGroup* g : {reward_model.get(), cost_model.get()})
    add(g, [&](const WorkerGroup& group, auto& t) {
      add_target(t, p.reward_model, "reward_model", group, {"compute_rm_score"});
    });
  return out;
}

void RLTrainer::State::start_profile(int64_t global_step) {
  check_profile_calls();
  std::string roles;
  for (auto& [group, targets] : profile_targets()) {
    CallProfileRequest request;
    request.step = global_step;
    request.dir = run.profiler.save_path;
    request.trace = run.profiler.trace;
    request.targets = std::move(targets);
    DataProto arm;
    arm.meta()["profile"] = request.to_json();
    profile_calls.push_back(group->call(kProfileMethod, arm));
    roles += (roles.empty() ? "" : ", ") + group->role();
  }
  profiling = true;
  log_info("profile: step ", global_step, ": profiling the calls of ", roles, " (traces in ", run.profiler.save_path,
           "/step_", global_step, ")");
}

void RLTrainer::State::end_profile() {
  if (!profiling) return;
  DataProto disarm;
  disarm.meta()["profile"] = nullptr;
  for (auto& entry : profile_targets()) profile_calls.push_back(entry.first->call(kProfileMethod, disarm));
  profiling = false;
}

void RLTrainer::State::check_profile_calls() {
  // Not waited for: a standalone rollout pool running ahead takes them after the generations queued before.
  std::erase_if(profile_calls, [](Future& f) {
    if (!f.is_ready()) return false;
    f.get();  // a worker's error surfaces here
    return true;
  });
}

void RLTrainer::State::finish_profiles() {
  for (Future& f : profile_calls) f.get();
  profile_calls.clear();
}

}  // namespace hybridflow
