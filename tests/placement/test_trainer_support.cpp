// What today's trainer runs, and the config fragment that makes it run a plan.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include "hybridflow/core/error.h"
#include "hybridflow/placement/trainer_support.h"

using namespace hybridflow::placement;

namespace {

Workload ppo() {
  Workload w;
  w.prompts = 64;
  w.mini_batches = 2;
  return w;
}

Plan plan_of(std::vector<DeviceSet> sets, Layout l = {1, 1, 0}) {
  Plan p;
  p.sets = std::move(sets);
  for (const auto& s : p.sets)
    for (Role r : s.roles) p.layout(r) = {l.pp, l.tp, s.devices / (l.pp * l.tp)};
  return p;
}

}  // namespace

TEST(TrainerSupport, TodaysTrainerColocatesAllOrGivesEachModelAPool) {
  const auto today = TrainerCapabilities::today();
  const Workload w = ppo();
  EXPECT_EQ(trainer_cannot_run(plan_of({{w.roles(), 8}}), today), "");
  const Plan split = plan_of({{{Role::kActor, Role::kRollout, Role::kRef}, 4}, {{Role::kCritic}, 2}, {{Role::kRewardModel}, 2}});
  EXPECT_EQ(trainer_cannot_run(split, today), "");
  EXPECT_NE(trainer_cannot_run(plan_of({{{Role::kActor, Role::kRollout}, 4}, {{Role::kRef, Role::kCritic, Role::kRewardModel}, 4}}),
                               today),
            "");
  EXPECT_NE(trainer_cannot_run(plan_of({{{Role::kActor, Role::kRollout, Role::kRef}, 4}, {{Role::kCritic, Role::kRewardModel}, 4}}),
                               today),
            "");
  const Plan standalone = plan_of({{{Role::kActor, Role::kRef, Role::kCritic, Role::kRewardModel}, 4}, {{Role::kRollout}, 4}});
  EXPECT_NE(trainer_cannot_run(standalone, today).find("rollout"), std::string::npos);
  EXPECT_EQ(trainer_cannot_run(standalone, TrainerCapabilities::anything()), "");
  // The reference shares the actor's processes, so its layout too.
  Plan other_ref = plan_of({{w.roles(), 8}});
  other_ref.layout(Role::kRef) = {1, 2, 4};
  EXPECT_NE(trainer_cannot_run(other_ref, today).find("reference"), std::string::npos);
}

TEST(TrainerSupport, FragmentHoldsThePlansKeys) {
  const Workload w = ppo();
  Plan split = plan_of({{{Role::kActor, Role::kRollout, Role::kRef}, 4}, {{Role::kCritic}, 2}, {{Role::kRewardModel}, 2}},
                       {1, 2, 0});
  split.layout(Role::kRollout) = {1, 1, 4};
  const YAML::Node y = YAML::Load(trainer_config_fragment(split, w, TrainerCapabilities::today()));
  EXPECT_FALSE(y["trainer"]["colocate"].as<bool>());
  EXPECT_EQ(y["data"]["train_batch_size"].as<int>(), 64);
  EXPECT_EQ(y["actor_rollout_ref"]["num_processes"].as<int>(), 4);
  EXPECT_EQ(y["actor_rollout_ref"]["actor"]["megatron"]["tensor_model_parallel_size"].as<int>(), 2);
  EXPECT_EQ(y["actor_rollout_ref"]["actor"]["ppo_mini_batch_size"].as<int>(), 32);
  EXPECT_EQ(y["actor_rollout_ref"]["actor"]["dtype"].as<std::string>(), "bf16");
  EXPECT_EQ(y["actor_rollout_ref"]["rollout"]["tensor_model_parallel_size"].as<int>(), 1);
  EXPECT_EQ(y["critic"]["num_processes"].as<int>(), 2);
  EXPECT_EQ(y["reward_model"]["num_processes"].as<int>(), 2);
  EXPECT_FALSE(y["cost_model"]);
  // Colocated: one pool, no per-role process counts.
  const YAML::Node c = YAML::Load(trainer_config_fragment(plan_of({{w.roles(), 8}}), w, TrainerCapabilities::today()));
  EXPECT_TRUE(c["trainer"]["colocate"].as<bool>());
  EXPECT_EQ(c["actor_rollout_ref"]["num_processes"].as<int>(), 8);
  EXPECT_FALSE(c["critic"]["num_processes"]);
}

TEST(TrainerSupport, AFragmentForAPlanTheTrainerCannotRunIsAnError) {
  const Workload w = ppo();
  const Plan standalone = plan_of({{{Role::kActor, Role::kRef, Role::kCritic, Role::kRewardModel}, 4}, {{Role::kRollout}, 4}});
  try {
    trainer_config_fragment(standalone, w, TrainerCapabilities::today());
    FAIL();
  } catch (const hybridflow::Error& e) {
    EXPECT_NE(std::string(e.what()).find("rollout"), std::string::npos) << e.what();
  }
}
