// A run without a reference model (no KL loss and no KL in the reward): the planner leaves the reference's
// call out of the iteration, never places it, and so simulates a shorter step than with one.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>

#include "hybridflow/placement/auto_mapping.h"
#include "hybridflow/placement/set_partitions.h"
#include "hybridflow/placement/trainer_support.h"

using namespace hybridflow::placement;

namespace {

// GRPO with rule rewards, as examples/grpo_async_sort.yaml runs it, at a GPU cluster's scale.
Workload grpo(bool reference) {
  Workload w;
  w.algorithm = Algorithm::kGRPO;
  w.reward_model = false;
  w.reference = reference;
  w.prompts = 64;
  w.samples_per_prompt = 4;
  w.prompt_length = 256;
  w.response_length = 256;
  return w;
}

bool has_role(const std::vector<Role>& roles, Role r) { return std::find(roles.begin(), roles.end(), r) != roles.end(); }

// Every role of the workload on one set of `devices`, t = 1 everywhere.
Plan colocated_plan(const Workload& w, int devices) {
  Plan p;
  p.sets.push_back({w.roles(), devices});
  for (Role r : w.roles()) p.layout(r) = {1, 1, devices};
  return p;
}

// The rollout on `devices` of its own, every other role on as many more.
Plan standalone_plan(const Workload& w, int devices, int staleness) {
  Plan p;
  std::vector<Role> trainer;
  for (Role r : w.roles())
    if (r != Role::kRollout) trainer.push_back(r);
  p.sets = {{trainer, devices}, {{Role::kRollout}, devices}};
  for (Role r : w.roles()) p.layout(r) = {1, 1, devices};
  p.staleness = staleness;
  return p;
}

}  // namespace

TEST(WorkloadReference, WithoutOneTheIterationHasNoReferenceCall) {
  const Workload with = grpo(true), without = grpo(false);
  EXPECT_TRUE(has_role(with.roles(), Role::kRef));
  EXPECT_FALSE(has_role(without.roles(), Role::kRef));
  const std::vector<Call> a = iteration_calls(with), b = iteration_calls(without);
  ASSERT_EQ(a.size(), b.size() + 1);
  for (const Call& c : b) {
    EXPECT_NE(c.role, Role::kRef);
    EXPECT_NE(c.kind, CallKind::kRefLogProb);
  }
  // The other calls are the same, and the updates wait for exactly the preparation calls that remain.
  std::vector<Call> a_without_ref;
  for (const Call& c : a)
    if (c.role != Role::kRef) a_without_ref.push_back(c);
  ASSERT_EQ(a_without_ref.size(), b.size());
  for (size_t i = 0; i < b.size(); ++i) {
    EXPECT_EQ(a_without_ref[i].role, b[i].role) << i;
    EXPECT_EQ(a_without_ref[i].kind, b[i].kind) << i;
    EXPECT_EQ(a_without_ref[i].rows, b[i].rows) << i;
  }
  for (const Call& c : b)
    for (int j : c.after) {
      ASSERT_GE(j, 0);
      ASSERT_LT(j, static_cast<int>(b.size()));
    }
  const Call& update = b.back();
  ASSERT_EQ(update.kind, CallKind::kUpdate);
  int preparation = 0;
  for (const Call& c : b) preparation += c.stage == Stage::kPreparation;
  EXPECT_EQ(static_cast<int>(update.after.size()), preparation);
  // PPO keeps its critic and reward model without a reference.
  Workload ppo;
  ppo.reference = false;
  EXPECT_EQ(ppo.roles(), (std::vector<Role>{Role::kActor, Role::kRollout, Role::kCritic, Role::kRewardModel}));
}

TEST(WorkloadReference, WithoutOneTheSimulatedStepIsStrictlyShorter) {
  const ClusterSpec c = gpu_cluster("a100-80g", 8, 8);
  const ModelShape m = model_preset("qwen2.5-0.5b");
  const Workload with = grpo(true), without = grpo(false);
  // Colocated: the reference's log-probs run on the same devices, one call more.
  const Estimate ca = simulate(colocated_plan(with, 8), c, m, with);
  const Estimate cb = simulate(colocated_plan(without, 8), c, m, without);
  ASSERT_TRUE(ca.feasible && cb.feasible) << ca.why_not << cb.why_not;
  EXPECT_LT(cb.iteration_s, ca.iteration_s);
  EXPECT_LT(cb.preparation_s, ca.preparation_s);
  EXPECT_LE(cb.generation_s, ca.generation_s);  // the reference's weights leave more room for the KV cache
  EXPECT_EQ(cb.training_s, ca.training_s);
  for (const CallEstimate& call : cb.calls) EXPECT_EQ(call.name.find("ref"), std::string::npos) << call.name;
  // A standalone rollout, synchronous and two steps ahead.
  for (int k : {0, 2}) {
    const Estimate sa = simulate(standalone_plan(with, 4, k), c, m, with);
    const Estimate sb = simulate(standalone_plan(without, 4, k), c, m, without);
    ASSERT_TRUE(sa.feasible && sb.feasible) << sa.why_not << sb.why_not;
    EXPECT_LT(sb.iteration_s, sa.iteration_s) << k;
  }
}

TEST(WorkloadReference, APlanThatPlacesAnAbsentReferenceSaysWhy) {
  const ClusterSpec c = gpu_cluster("a100-80g", 8, 8);
  const Workload without = grpo(false);
  const Estimate e = simulate(colocated_plan(grpo(true), 8), c, model_preset("qwen2.5-0.5b"), without);
  EXPECT_FALSE(e.feasible);
  EXPECT_NE(e.why_not.find("reference"), std::string::npos) << e.why_not;
}

TEST(WorkloadReference, TheSearchNeverPlacesAnAbsentReference) {
  const ClusterSpec c = gpu_cluster("a100-80g", 8, 8);
  const ModelShape m = model_preset("qwen2.5-0.5b");
  SearchOptions o;
  o.runners_up = 50;
  const SearchResult with = search_plans(c, m, grpo(true), o);
  const SearchResult without = search_plans(c, m, grpo(false), o);
  EXPECT_EQ(with.placements, static_cast<int64_t>(bell_number(3)));     // actor, rollout, ref
  EXPECT_EQ(without.placements, static_cast<int64_t>(bell_number(2)));  // actor, rollout
  ASSERT_TRUE(with.found && without.found);
  std::vector<const RankedPlan*> plans = {&without.best};
  for (const RankedPlan& r : without.runners_up) plans.push_back(&r);
  for (const RankedPlan* r : plans) {
    EXPECT_LT(r->plan.set_of(Role::kRef), 0) << r->plan.describe();
    for (const CallEstimate& call : r->estimate.calls) EXPECT_NE(call.name, "actor.compute_ref_log_prob");
  }
  // The best plan with the reference, less the reference, is a candidate of the search without it.
  EXPECT_LE(without.best.estimate.iteration_s, with.best.estimate.iteration_s);
}

TEST(WorkloadReference, TheFragmentOfAPlanWithoutOneHasNoReferenceSection) {
  Workload w = grpo(false);
  w.prompts = 8;
  const Plan standalone = standalone_plan(w, 2, 2);
  EXPECT_EQ(trainer_cannot_run(standalone, TrainerCapabilities::today()), "");
  const std::string text = trainer_config_fragment(standalone, w, TrainerCapabilities::today());
  const YAML::Node y = YAML::Load(text);
  EXPECT_EQ(y["trainer"]["placement"].as<std::string>(), "standalone");
  EXPECT_FALSE(y["actor_rollout_ref"]["ref"]);
  EXPECT_EQ(y["actor_rollout_ref"]["rollout"]["staleness"].as<int>(), 2);
  EXPECT_NE(text.find("without a reference model"), std::string::npos) << text;
  // With one, the reference's micro-batch is written and no such note.
  const Workload with = grpo(true);
  const std::string with_text = trainer_config_fragment(standalone_plan(with, 2, 2), with, TrainerCapabilities::today());
  EXPECT_TRUE(YAML::Load(with_text)["actor_rollout_ref"]["ref"]);
  EXPECT_EQ(with_text.find("without a reference model"), std::string::npos) << with_text;
}
