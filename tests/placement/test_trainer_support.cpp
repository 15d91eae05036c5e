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

TEST(TrainerSupport, TheTrainerRunsAnyPoolsButKeepsTheReferenceWithTheActor) {
  const auto today = TrainerCapabilities::today();
  const Workload w = ppo();
  EXPECT_EQ(trainer_cannot_run(plan_of({{w.roles(), 8}}), today), "");
  const Plan split = plan_of({{{Role::kActor, Role::kRollout, Role::kRef}, 4}, {{Role::kCritic}, 2}, {{Role::kRewardModel}, 2}});
  EXPECT_EQ(trainer_cannot_run(split, today), "");
  EXPECT_NE(trainer_cannot_run(plan_of({{{Role::kActor, Role::kRollout}, 4}, {{Role::kRef, Role::kCritic, Role::kRewardModel}, 4}}),
                               today)
                .find("reference"),
            std::string::npos);
  const Plan standalone = plan_of({{{Role::kActor, Role::kRef, Role::kCritic, Role::kRewardModel}, 4}, {{Role::kRollout}, 4}});
  EXPECT_EQ(trainer_cannot_run(standalone, today), "");
  // Without pools: only the presets.
  TrainerCapabilities presets = today;
  presets.any_pools = false;
  EXPECT_EQ(trainer_cannot_run(plan_of({{{Role::kActor, Role::kRollout, Role::kRef}, 4}, {{Role::kCritic, Role::kRewardModel}, 4}}),
                               presets),
            "");
  EXPECT_NE(trainer_cannot_run(split, presets), "");
  EXPECT_EQ(trainer_cannot_run(standalone, presets), "");
  // The trainer's standalone rollout is unstaged.
  Plan staged = standalone;
  staged.layout(Role::kRollout) = {2, 1, 2};
  EXPECT_NE(trainer_cannot_run(staged, today).find("p_g"), std::string::npos);
  EXPECT_EQ(trainer_cannot_run(staged, TrainerCapabilities::anything()), "");
  // The reference shares the actor's processes, so its layout too.
  Plan other_ref = plan_of({{w.roles(), 8}});
  other_ref.layout(Role::kRef) = {1, 2, 4};
  EXPECT_NE(trainer_cannot_run(other_ref, today).find("reference"), std::string::npos);
}

TEST(TrainerSupport, FragmentWritesThePresetAndThePlansKeys) {
  const Workload w = ppo();
  Plan split = plan_of({{{Role::kActor, Role::kRollout, Role::kRef}, 4}, {{Role::kCritic, Role::kRewardModel}, 4}}, {1, 2, 0});
  split.layout(Role::kRollout) = {1, 1, 4};
  const YAML::Node y = YAML::Load(trainer_config_fragment(split, w, TrainerCapabilities::today()));
  EXPECT_EQ(y["trainer"]["placement"].as<std::string>(), "split");
  EXPECT_FALSE(y["pools"]);
  EXPECT_EQ(y["data"]["train_batch_size"].as<int>(), 64);
  EXPECT_EQ(y["actor_rollout_ref"]["num_processes"].as<int>(), 4);
  EXPECT_EQ(y["actor_rollout_ref"]["actor"]["megatron"]["tensor_model_parallel_size"].as<int>(), 2);
  EXPECT_EQ(y["actor_rollout_ref"]["actor"]["ppo_mini_batch_size"].as<int>(), 32);
  EXPECT_EQ(y["actor_rollout_ref"]["actor"]["dtype"].as<std::string>(), "bf16");
  EXPECT_EQ(y["actor_rollout_ref"]["rollout"]["tensor_model_parallel_size"].as<int>(), 1);
  EXPECT_FALSE(y["actor_rollout_ref"]["rollout"]["staleness"]);
  EXPECT_EQ(y["critic"]["num_processes"].as<int>(), 4);  // the split preset's second pool is sized by the critic
  EXPECT_FALSE(y["reward_model"]["num_processes"]);
  EXPECT_FALSE(y["cost_model"]);
  // Colocated: one pool, no per-role process counts.
  const YAML::Node c = YAML::Load(trainer_config_fragment(plan_of({{w.roles(), 8}}), w, TrainerCapabilities::today()));
  EXPECT_EQ(c["trainer"]["placement"].as<std::string>(), "colocate");
  EXPECT_EQ(c["actor_rollout_ref"]["num_processes"].as<int>(), 8);
  EXPECT_FALSE(c["critic"]["num_processes"]);
  // Standalone: the rollout pool's size and the staleness.
  Plan standalone = plan_of({{{Role::kActor, Role::kRef, Role::kCritic, Role::kRewardModel}, 6}, {{Role::kRollout}, 2}});
  standalone.staleness = 1;
  const YAML::Node s = YAML::Load(trainer_config_fragment(standalone, w, TrainerCapabilities::today()));
  EXPECT_EQ(s["trainer"]["placement"].as<std::string>(), "standalone");
  EXPECT_EQ(s["actor_rollout_ref"]["num_processes"].as<int>(), 6);
  EXPECT_EQ(s["actor_rollout_ref"]["rollout"]["num_processes"].as<int>(), 2);
  EXPECT_EQ(s["actor_rollout_ref"]["rollout"]["staleness"].as<int>(), 1);
}

TEST(TrainerSupport, AnyOtherGroupingIsAPoolsSection) {
  const Workload w = ppo();
  const Plan three = plan_of({{{Role::kActor, Role::kRollout, Role::kRef}, 4}, {{Role::kCritic}, 2}, {{Role::kRewardModel}, 2}});
  const YAML::Node y = YAML::Load(trainer_config_fragment(three, w, TrainerCapabilities::today()));
  EXPECT_FALSE(y["trainer"]);
  EXPECT_FALSE(y["actor_rollout_ref"]["num_processes"]);  // a pools: section sizes every role
  EXPECT_FALSE(y["critic"]["num_processes"]);
  ASSERT_TRUE(y["pools"].IsMap());
  EXPECT_EQ(y["pools"].size(), 3u);
  EXPECT_EQ(y["pools"]["actor"]["processes"].as<int>(), 4);
  // Neither the reference nor a rollout beside the actor is placed on its own.
  EXPECT_EQ(y["pools"]["actor"]["roles"].as<std::vector<std::string>>(), std::vector<std::string>{"actor"});
  EXPECT_EQ(y["pools"]["critic"]["roles"].as<std::vector<std::string>>(), std::vector<std::string>{"critic"});
  EXPECT_EQ(y["pools"]["reward_model"]["processes"].as<int>(), 2);
  // A standalone rollout sharing its pool with another model.
  Plan shared = plan_of({{{Role::kActor, Role::kRef, Role::kRewardModel}, 4}, {{Role::kRollout, Role::kCritic}, 4}});
  const YAML::Node s = YAML::Load(trainer_config_fragment(shared, w, TrainerCapabilities::today()));
  EXPECT_EQ(s["pools"]["rollout"]["roles"].as<std::vector<std::string>>(), (std::vector<std::string>{"rollout", "critic"}));
  EXPECT_EQ(s["actor_rollout_ref"]["rollout"]["staleness"].as<int>(), 0);
}

TEST(TrainerSupport, AFragmentForAPlanTheTrainerCannotRunIsAnError) {
  const Workload w = ppo();
  const Plan apart = plan_of({{{Role::kActor, Role::kRollout}, 4}, {{Role::kRef, Role::kCritic, Role::kRewardModel}, 4}});
  try {
    trainer_config_fragment(apart, w, TrainerCapabilities::today());
    FAIL();
  } catch (const hybridflow::Error& e) {
    EXPECT_NE(std::string(e.what()).find("reference"), std::string::npos) << e.what();
  }
}

// A mixture of experts: a training role split over t > 1 tensor-parallel ranks folds its experts over them
// (expert_model_parallel_size t), which is what the memory estimate divides them by; a dense model, or t = 1,
// gets no key; a standalone rollout takes such an actor's weights (the experts sent gathered).
TEST(TrainerSupport, AMixtureOfExpertsFoldsItsExpertsOverTheTrainingRolesTensorRanks) {
  const Workload w = ppo();
  const ModelShape moe = model_preset("qwen3-30b-a3b"), dense = model_preset("qwen2.5-0.5b");
  ASSERT_GT(moe.moe.num_experts, 0);
  Plan split = plan_of({{{Role::kActor, Role::kRollout, Role::kRef}, 4}, {{Role::kCritic, Role::kRewardModel}, 4}}, {1, 2, 0});
  split.layout(Role::kRollout) = {1, 1, 4};
  const YAML::Node y = YAML::Load(trainer_config_fragment(split, w, TrainerCapabilities::today(), &moe));
  EXPECT_EQ(y["actor_rollout_ref"]["actor"]["megatron"]["expert_model_parallel_size"].as<int>(), 2);
  EXPECT_EQ(y["critic"]["megatron"]["expert_model_parallel_size"].as<int>(), 2);
  EXPECT_FALSE(y["reward_model"]["megatron"]["expert_model_parallel_size"]);  // it does not train
  EXPECT_FALSE(YAML::Load(trainer_config_fragment(split, w, TrainerCapabilities::today(), &dense))["actor_rollout_ref"]
                   ["actor"]["megatron"]["expert_model_parallel_size"]);
  EXPECT_FALSE(YAML::Load(trainer_config_fragment(plan_of({{w.roles(), 8}}), w, TrainerCapabilities::today(), &moe))
                   ["actor_rollout_ref"]["actor"]["megatron"]["expert_model_parallel_size"]);
  Plan standalone =
      plan_of({{{Role::kActor, Role::kRef, Role::kCritic, Role::kRewardModel}, 4}, {{Role::kRollout}, 4}}, {1, 2, 0});
  // The actor sends its experts gathered to a standalone rollout (engine/weight_sync.h).
  EXPECT_EQ(trainer_cannot_run(standalone, TrainerCapabilities::today(), &moe), "");
  EXPECT_EQ(trainer_cannot_run(standalone, TrainerCapabilities::today(), &dense), "");
  EXPECT_EQ(YAML::Load(trainer_config_fragment(standalone, w, TrainerCapabilities::today(), &moe))["actor_rollout_ref"]
                ["actor"]["megatron"]["expert_model_parallel_size"]
                    .as<int>(),
            2);
}
