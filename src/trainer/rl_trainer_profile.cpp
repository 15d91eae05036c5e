// global_profiler (verl's keys, tool torch): each profiled step arms the worker groups whose roles have their
// profiler enabled at its start and disarms them at its end (runtime/call_profiler.h), so every call the
// controller dispatched to them in that step runs under libtorch's profiler on the chosen ranks. With tool
// torch_memory the same arming records the ranks' CUDA allocations, and the disarm writes their snapshots.
#include "rl_trainer_state.h"

#include <set>

#include "hybridflow/runtime/call_profiler.h"

namespace hybridflow {

namespace {

// A role's profiler section and the methods it covers.
struct ProfiledSection {
  const ProfilerRunSpec::Role& role;
  const char* name;
  std::set<std::string> methods;
};

// The targets of `group` for `sections`: each enabled section's methods that the group has.
std::vector<CallProfileRequest::Target> targets_of(const WorkerGroup& group,
                                                   const std::vector<ProfiledSection>& sections) {
  std::vector<CallProfileRequest::Target> targets;
  for (const ProfiledSection& s : sections) {
    if (!s.role.enable) continue;
    for (int rank : s.role.ranks)
      HF_CHECK(s.role.all_ranks || rank < group.world_size(), s.name, ".profiler.ranks: rank ", rank,
               " is out of range: role '", group.role(), "' has ", group.world_size(), " rank",
               group.world_size() == 1 ? "" : "s");
    CallProfileRequest::Target t;
    for (const std::string& m : s.methods)
      if (group.methods().count(m)) t.methods.insert(m);
    if (t.methods.empty()) continue;
    t.all_ranks = s.role.all_ranks;
    t.ranks.insert(s.role.ranks.begin(), s.role.ranks.end());
    t.contents = s.role.contents;
    targets.push_back(std::move(t));
  }
  return targets;
}

}  // namespace

std::vector<std::pair<WorkerGroup*, std::vector<CallProfileRequest::Target>>> RLTrainer::State::profile_targets()
    const {
  const ProfilerRunSpec& p = run.profiler;
  // The actor's group generates unless a standalone rollout pool does; Safe-RLHF's cost critic and cost model
  // take the critic's and the reward model's sections.
  const std::set<std::string> actor_generates =
      rollout ? std::set<std::string>() : std::set<std::string>{"generate_sequences"};
  const std::vector<std::pair<WorkerGroup*, std::vector<ProfiledSection>>> groups = {
      {actor.get(),
       {{p.actor, "actor_rollout_ref.actor", {"update_actor", "compute_log_prob", "send_weights"}},
        {p.rollout, "actor_rollout_ref.rollout", actor_generates},
        {p.ref, "actor_rollout_ref.ref", {"compute_ref_log_prob"}}}},
      {rollout.get(), {{p.rollout, "actor_rollout_ref.rollout", {"generate_sequences", "receive_weights"}}}},
      {critic.get(), {{p.critic, "critic", {"compute_values", "update_critic"}}}},
      {cost_critic.get(), {{p.critic, "critic", {"compute_values", "update_critic"}}}},
      {reward_model.get(), {{p.reward_model, "reward_model", {"compute_rm_score"}}}},
      {cost_model.get(), {{p.reward_model, "reward_model", {"compute_rm_score"}}}},
  };
  std::vector<std::pair<WorkerGroup*, std::vector<CallProfileRequest::Target>>> out;
  for (const auto& [group, sections] : groups) {
    if (group == nullptr) continue;
    std::vector<CallProfileRequest::Target> targets = targets_of(*group, sections);
    if (!targets.empty()) out.emplace_back(group, std::move(targets));
  }
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
    request.tool = run.profiler.tool;
    request.memory = run.profiler.memory;
    request.targets = std::move(targets);
    DataProto arm;
    arm.meta()["profile"] = request.to_json();
    profile_calls.push_back(group->call(kProfileMethod, arm));
    roles += (roles.empty() ? "" : ", ") + group->role();
  }
  if (run.profiler.tool == "torch_memory")
    log_info("profile: step ", global_step, ": CUDA memory snapshots of ", roles, " at the step's end (in ",
             run.profiler.save_path, "/step_", global_step, ")");
  else
    log_info("profile: step ", global_step, ": profiling the calls of ", roles, " (traces in ", run.profiler.save_path,
             "/step_", global_step, ")");
}

void RLTrainer::State::end_profile() {
  if (!run.profiler.profiles(step + 1)) return;  // the step's number as start_profile had it
  DataProto disarm;
  disarm.meta()["profile"] = nullptr;
  for (auto& entry : profile_targets()) profile_calls.push_back(entry.first->call(kProfileMethod, disarm));
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
