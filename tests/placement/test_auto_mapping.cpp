// The search (HybridFlow Algorithms 1 and 2): it considers every placement, returns a plan that fits and
// simulates to the time it reports, no slower than any runner-up or a hand-made plan, and keeps to what
// today's trainer runs when asked.
#include <gtest/gtest.h>

#include <string>

#include "hybridflow/placement/auto_mapping.h"
#include "hybridflow/placement/role_costs.h"
#include "hybridflow/placement/trainer_support.h"
#include "hybridflow/placement/set_partitions.h"

using namespace hybridflow::placement;

namespace {

Workload ppo() {
  Workload w;
  w.prompts = 256;
  w.prompt_length = 512;
  w.response_length = 512;
  return w;
}

}  // namespace

TEST(AutoMapping, SetSizesAreNodePartsAndWholeNodes) {
  EXPECT_EQ(set_sizes(gpu_cluster("a100-80g", 32, 8)), (std::vector<int>{1, 2, 4, 8, 16, 24, 32}));
  EXPECT_EQ(set_sizes(gpu_cluster("a100-80g", 4, 8)), (std::vector<int>{1, 2, 4}));
}

TEST(AutoMapping, ConsidersEveryPlacementAndReturnsAFeasibleBestPlan) {
  const ClusterSpec c = gpu_cluster("a100-80g", 16, 8);
  const ModelShape m = model_preset("llama-7b");
  const Workload w = ppo();
  SearchOptions o;
  o.runners_up = 50;
  const SearchResult r = search_plans(c, m, w, o);
  EXPECT_EQ(r.placements, static_cast<int64_t>(bell_number(5)));  // actor, rollout, ref, critic, reward model
  ASSERT_TRUE(r.found);
  EXPECT_TRUE(r.best.estimate.feasible) << r.best.estimate.why_not;
  EXPECT_EQ(r.best.plan.devices(), 16);
  for (const SetMemory& mem : r.best.estimate.memory) EXPECT_LE(mem.peak, mem.usable);
  // The time the search ranked by is the simulator's.
  const Estimate again = simulate(r.best.plan, c, m, w);
  EXPECT_DOUBLE_EQ(again.iteration_s, r.best.estimate.iteration_s);
  ASSERT_FALSE(r.runners_up.empty());
  for (const RankedPlan& other : r.runners_up) {
    EXPECT_TRUE(other.estimate.feasible);
    EXPECT_LE(r.best.estimate.iteration_s, other.estimate.iteration_s);
    EXPECT_NE(other.plan.describe(), r.best.plan.describe());
  }
  // No slower than a reasonable plan made by hand: everything colocated, t = 2 everywhere.
  Plan hand;
  hand.sets.push_back({w.roles(), 16});
  for (Role role : w.roles()) hand.layout(role) = {1, 2, 8};
  const Estimate by_hand = simulate(hand, c, m, w);
  ASSERT_TRUE(by_hand.feasible) << by_hand.why_not;
  EXPECT_LE(r.best.estimate.iteration_s, by_hand.iteration_s);
  EXPECT_GT(r.set_layouts, 0);
  EXPECT_GT(r.allocations, 0);
}

TEST(AutoMapping, AlgorithmsHaveTheirRoles) {
  const ClusterSpec c = gpu_cluster("a100-80g", 8, 8);
  const ModelShape m = model_preset("llama-7b");
  Workload w = ppo();
  w.algorithm = Algorithm::kGRPO;
  w.reward_model = false;
  w.samples_per_prompt = 4;
  SearchOptions o;
  o.runners_up = 0;
  EXPECT_EQ(search_plans(c, m, w, o).placements, static_cast<int64_t>(bell_number(3)));  // actor, rollout, ref
  w.algorithm = Algorithm::kReMax;
  w.reward_model = true;
  w.samples_per_prompt = 1;
  const SearchResult remax = search_plans(c, m, w, o);
  EXPECT_EQ(remax.placements, static_cast<int64_t>(bell_number(4)));
  ASSERT_TRUE(remax.found);
  int generations = 0;
  for (const auto& call : remax.best.estimate.calls) generations += call.stage == Stage::kGeneration;
  EXPECT_EQ(generations, 2);  // the greedy baseline and the sampled responses
}

TEST(AutoMapping, MoreDevicesAreNeverSlower) {
  const ModelShape m = model_preset("llama-13b");
  const Workload w = ppo();
  SearchOptions o;
  o.runners_up = 0;
  double previous = 1e30;
  for (int gpus : {8, 16, 32}) {
    const SearchResult r = search_plans(gpu_cluster("a100-80g", gpus, 8), m, w, o);
    ASSERT_TRUE(r.found) << gpus;
    EXPECT_LE(r.best.estimate.iteration_s, previous * 1.0001) << gpus;
    previous = r.best.estimate.iteration_s;
  }
}

TEST(AutoMapping, TodaysTrainerRestrictsThePlacements) {
  const ClusterSpec c = gpu_cluster("a100-80g", 16, 8);
  SearchOptions o;
  o.capabilities = TrainerCapabilities::today();
  o.runners_up = 10;
  const SearchResult r = search_plans(c, model_preset("llama-7b"), ppo(), o);
  ASSERT_TRUE(r.found);
  // Any grouping of the four placeable roles (the reference lives with the actor): Bell(4).
  EXPECT_EQ(r.placements, 15);
  EXPECT_EQ(trainer_cannot_run(r.best.plan, o.capabilities), "");
  for (const auto& other : r.runners_up) EXPECT_EQ(trainer_cannot_run(other.plan, o.capabilities), "");
  // The reference follows the actor's layout: it shares the actor's processes.
  EXPECT_EQ(r.best.plan.layout(Role::kRef).tp, r.best.plan.layout(Role::kActor).tp);
  EXPECT_EQ(r.best.plan.layout(Role::kRef).pp, r.best.plan.layout(Role::kActor).pp);
}

TEST(AutoMapping, NothingFitsTooFewDevices) {
  SearchOptions o;
  o.runners_up = 0;
  const SearchResult r = search_plans(gpu_cluster("a100-80g", 2, 8), model_preset("llama-70b"), ppo(), o);
  EXPECT_FALSE(r.found);
}

TEST(AutoMapping, StalenessOneMakesAStandaloneRolloutNoSlower) {
  const ClusterSpec c = gpu_cluster("a100-80g", 16, 8);
  const ModelShape m = model_preset("llama-7b");
  Workload w = ppo();
  SearchOptions o;
  o.runners_up = 60;
  auto best_standalone = [&](const SearchResult& r) {
    double best = 1e30;
    if (r.best.plan.placement_name() == "standalone") best = r.best.estimate.iteration_s;
    for (const auto& x : r.runners_up)
      if (x.plan.placement_name() == "standalone") best = std::min(best, x.estimate.iteration_s);
    return best;
  };
  const double on_policy = best_standalone(search_plans(c, m, w, o));
  w.staleness = 1;
  const double off_policy = best_standalone(search_plans(c, m, w, o));
  ASSERT_LT(on_policy, 1e30);
  EXPECT_LT(off_policy, on_policy);
}

// Long sequences: GRPO on 32k-token sequences of the Qwen3-1.7B shape over 8 single-GPU nodes (so no tensor
// parallelism, and pipeline stages keep L layers' activations in flight): a rank's activations and logits do
// not fit at sequence-parallel size 1, and the plan splits each sequence (Ulysses), the reference with the
// actor, and its fragment for `hybridflow train` carries the size. The simulator counts a rank's layer
// activations over the group size (the logits stay whole), and the all-to-alls as communication.
TEST(AutoMapping, LongSequencesThatDoNotFitWholeArePlacedWithSequenceParallelism) {
  const ClusterSpec c = gpu_cluster("a100-80g", 8, 1);
  const ModelShape m = model_preset("qwen3-1.7b");
  Workload w;
  w.algorithm = Algorithm::kGRPO;
  w.reward_model = false;
  w.prompts = 8;
  w.samples_per_prompt = 8;
  w.prompt_length = 1024;
  w.response_length = 31 * 1024;
  w.infer_micro_rows = 1;
  const CostInputs in{c, m, w};
  const RoleMemory whole = role_memory(in, Role::kActor, {1, 1, 8, 1});
  const RoleMemory split = role_memory(in, Role::kActor, {1, 1, 8, 4});
  EXPECT_EQ(split.persistent, whole.persistent);
  EXPECT_GT(whole.persistent + whole.transient, c.usable_memory());
  EXPECT_LT(split.persistent + split.transient, c.usable_memory());
  EXPECT_EQ(forward_seconds(in, Role::kActor, {1, 1, 8, 1}, 64).comm_s, 0.0);
  EXPECT_GT(forward_seconds(in, Role::kActor, {1, 1, 8, 4}, 64).comm_s, 0.0);

  SearchOptions o;
  o.capabilities = TrainerCapabilities::today();
  o.runners_up = 0;
  const SearchResult r = search_plans(c, m, w, o);
  ASSERT_TRUE(r.found);
  const Layout& actor = r.best.plan.layout(Role::kActor);
  EXPECT_GT(actor.sp, 1) << layout_text(Role::kActor, actor);
  EXPECT_EQ(r.best.plan.layout(Role::kRef).sp, actor.sp);
  EXPECT_EQ(trainer_cannot_run(r.best.plan, o.capabilities), "");
  EXPECT_NE(trainer_config_fragment(r.best.plan, w, o.capabilities)
                .find("ulysses_sequence_parallel_size: " + std::to_string(actor.sp)),
            std::string::npos);
}
