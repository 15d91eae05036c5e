// Placement resolution (placement/placement_spec.h) against the RL schema: the three presets, the deprecated
// trainer.colocate, a pools: section in any shape, and every impossible assignment an error at start that
// names the key, before any process exists (no worker is spawned in this file).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "hybridflow/placement/placement_spec.h"
#include "hybridflow/runtime/worker_main.h"
#include "hybridflow/trainer/rl_trainer.h"
#include "hybridflow/workers/rl_workers.h"
#include "support/error_of.h"
#include "support/tiny_rl_config.h"

// Only a bug would start workers here; they must then run as workers, not as this test.
static const bool kRanAsWorker = (hybridflow::register_rl_workers(), hybridflow::run_worker_if_requested());

namespace hybridflow {
namespace {

using ::testing::HasSubstr;
using hybridflow::testing::error_of;

const std::vector<std::string> kPpoRoles = {"actor", "critic"};

RolePlacement resolve(const std::vector<std::string>& overrides, const std::vector<std::string>& roles = kPpoRoles) {
  return resolve_placement(load_rl_config("", overrides), roles);
}

std::vector<std::string> names(const RolePlacement& p) {
  std::vector<std::string> out;
  for (const auto& pool : p.pools) out.push_back(pool.name + ":" + std::to_string(pool.processes));
  return out;
}

TEST(PlacementConfig, PresetsAndTheDeprecatedColocateKey) {
  const RolePlacement colocate = resolve({"actor_rollout_ref.num_processes=2"});
  EXPECT_EQ(colocate.kind, "colocate");
  EXPECT_EQ(names(colocate), (std::vector<std::string>{"global:2"}));
  EXPECT_EQ(colocate.pools[0].roles, kPpoRoles);
  EXPECT_FALSE(colocate.standalone_rollout());

  const RolePlacement split = resolve({"trainer.placement=split", "critic.num_processes=3"},
                                      {"actor", "critic", "cost_critic", "reward_model"});
  EXPECT_EQ(names(split), (std::vector<std::string>{"actor:1", "critic:3"}));
  EXPECT_EQ(split.pool_of("reward_model").name, "critic");
  EXPECT_EQ(split.pool_of("cost_critic").name, "critic");
  // Without a critic the reward model's pool is sized by its own key.
  EXPECT_EQ(names(resolve({"trainer.placement=split", "reward_model.num_processes=2"}, {"actor", "reward_model"})),
            (std::vector<std::string>{"actor:1", "reward:2"}));

  const RolePlacement standalone =
      resolve({"trainer.placement=standalone", "actor_rollout_ref.rollout.num_processes=2", "actor_rollout_ref.rollout.staleness=1"});
  EXPECT_EQ(names(standalone), (std::vector<std::string>{"train:1", "rollout:2"}));
  EXPECT_EQ(standalone.pool_of("critic").name, "train");
  EXPECT_TRUE(standalone.standalone_rollout());
  EXPECT_EQ(standalone.staleness, 1);

  EXPECT_EQ(resolve({"trainer.colocate=false"}).kind, "split");
  EXPECT_EQ(resolve({"trainer.colocate=true"}).kind, "colocate");
}

TEST(PlacementConfig, APoolsSectionPlacesRolesAnywhereInItsOrder) {
  const RolePlacement p = resolve({"pools.gen.processes=2", "pools.gen.roles=[rollout]", "pools.learn.processes=1",
                                   "pools.learn.roles=[critic, actor]"});
  EXPECT_EQ(p.kind, "pools");
  EXPECT_EQ(names(p), (std::vector<std::string>{"gen:2", "learn:1"}));
  EXPECT_EQ(p.pool_of("actor").roles, kPpoRoles) << "roles in a pool keep placeable_roles() order";
  EXPECT_EQ(p.pool_of("actor").processes_key, "pools.learn.processes");
  EXPECT_TRUE(p.standalone_rollout());
  // A role this run does not have is skipped, and so is a pool left empty.
  const RolePlacement grpo = resolve({"pools.a.processes=1", "pools.a.roles=[actor]", "pools.b.processes=1",
                                      "pools.b.roles=[critic]"},
                                     {"actor"});
  EXPECT_EQ(names(grpo), (std::vector<std::string>{"a:1"}));
}

TEST(PlacementConfig, ImpossibleAssignmentsAreErrorsNamingTheKey) {
  auto error = [](const std::vector<std::string>& overrides, const std::vector<std::string>& roles = kPpoRoles) {
    return error_of([&] { resolve(overrides, roles); });
  };
  EXPECT_THAT(error({"pools.a.processes=1", "pools.a.roles=[actor, critic, value]"}),
              HasSubstr("pools.a.roles: unknown role 'value'"));
  EXPECT_THAT(error({"pools.a.processes=1", "pools.a.roles=[actor, ref, critic]"}),
              HasSubstr("lives in the actor's processes"));
  EXPECT_THAT(error({"pools.a.processes=1", "pools.a.roles=[actor, critic]", "pools.b.processes=1",
                     "pools.b.roles=[critic]"}),
              HasSubstr("role 'critic' is in two pools: pools.a and pools.b"));
  EXPECT_THAT(error({"pools.a.processes=1", "pools.a.roles=[actor]"}), HasSubstr("role 'critic' is not placed"));
  EXPECT_THAT(error({"pools.a.processes=0", "pools.a.roles=[actor, critic]"}), HasSubstr("pools.a.processes must be >= 1"));
  EXPECT_THAT(error({"pools.a.roles=[actor, critic]"}), HasSubstr("pools.a.processes is missing"));
  EXPECT_THAT(error({"pools.a.processes=1", "pools.a.roles=[actor, critic]", "pools.a.gpus=2"}),
              HasSubstr("unknown key 'pools.a.gpus'"));
  EXPECT_THAT(error({"pools.controller.processes=1", "pools.controller.roles=[actor, critic]"}),
              HasSubstr("a pool name is letters"));
  EXPECT_THAT(error({"trainer.placement=split", "pools.a.processes=1", "pools.a.roles=[actor, critic]"}),
              HasSubstr("are both set"));
  EXPECT_THAT(error({"trainer.placement=split", "trainer.colocate=true"}), HasSubstr("are both set"));
  EXPECT_THAT(error({"trainer.placement=interleave"}), HasSubstr("expected colocate | split | standalone"));
  EXPECT_THAT(error({"actor_rollout_ref.rollout.staleness=1"}), HasSubstr("needs generation on its own pool"));
  EXPECT_THAT(error({"trainer.placement=standalone", "actor_rollout_ref.rollout.staleness=-1"}),
              HasSubstr("expected k >= 0"));
  EXPECT_EQ(resolve({"trainer.placement=standalone", "actor_rollout_ref.rollout.staleness=3"}).staleness, 3);
  // Weights synced every N updates lag up to N - 1 versions: N may not exceed staleness + 1.
  EXPECT_EQ(resolve({"trainer.placement=standalone", "actor_rollout_ref.rollout.staleness=2",
                     "actor_rollout_ref.rollout.trigger_parameter_sync_step=3"})
                .sync_every,
            3);
  EXPECT_THAT(error({"trainer.placement=standalone", "actor_rollout_ref.rollout.staleness=1",
                     "actor_rollout_ref.rollout.trigger_parameter_sync_step=3"}),
              HasSubstr("trigger_parameter_sync_step: expected 1 to staleness + 1 = 2"));
  EXPECT_THAT(error({"actor_rollout_ref.rollout.trigger_parameter_sync_step=2"}),
              HasSubstr("trigger_parameter_sync_step: expected 1 to staleness + 1 = 1"));
  EXPECT_THAT(error({"trainer.placement=standalone", "actor_rollout_ref.rollout.num_processes=0"}),
              HasSubstr("actor_rollout_ref.rollout.num_processes must be >= 1"));
}

// Checks that need the roles' layouts run in the trainer's constructor, still before any process starts.
TEST(PlacementConfig, APoolTooSmallForARoleLayoutFailsBeforeAnyProcessStarts) {
  using hybridflow::testing::tiny_rl_overrides;
  EXPECT_THAT(error_of([] {
                RLTrainer t(load_rl_config("", tiny_rl_overrides("gae", {"pools.a.processes=2", "pools.a.roles=[actor]",
                                                                         "pools.b.processes=3", "pools.b.roles=[critic]",
                                                                         "critic.megatron.tensor_model_parallel_size=2"})));
              }),
              HasSubstr("pools.b.processes = 3 processes do not divide into model-parallel groups"));
  EXPECT_THAT(error_of([] {
                RLTrainer t(load_rl_config("", tiny_rl_overrides("grpo", {"trainer.placement=standalone",
                                                                          "actor_rollout_ref.rollout.num_processes=3",
                                                                          "actor_rollout_ref.rollout.tensor_model_parallel_size=2"})));
              }),
              HasSubstr("actor_rollout_ref.rollout.num_processes = 3 processes do not divide into generation replicas"));
  EXPECT_THAT(error_of([] {
                RLTrainer t(load_rl_config("", tiny_rl_overrides("remax", {"trainer.placement=standalone",
                                                                           "actor_rollout_ref.rollout.staleness=1"})));
              }),
              HasSubstr("adv_estimator remax generates a greedy baseline"));
}

}  // namespace
}  // namespace hybridflow
