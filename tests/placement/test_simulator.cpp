// The dataflow schedule: colocated calls run one after another, disjoint sets overlap, a standalone rollout
// with staleness 1 overlaps generation with training; plans that cannot run say why.
#include <gtest/gtest.h>

#include <numeric>

#include "hybridflow/placement/simulator.h"

using namespace hybridflow::placement;

namespace {

Workload ppo(int64_t prompts = 256) {
  Workload w;
  w.prompts = prompts;
  w.prompt_length = 512;
  w.response_length = 512;
  return w;
}

Plan colocate_all(const Workload& w, int devices, Layout train, Layout gen) {
  Plan p;
  p.sets.push_back({w.roles(), devices});
  for (Role r : w.roles()) p.layout(r) = r == Role::kRollout ? gen : train;
  return p;
}

}  // namespace

TEST(Schedule, ByHandOnSyntheticDurations) {
  // Calls of PPO without a reward model: generate, log-prob, ref, values, critic update, actor update.
  Workload w;
  w.reward_model = false;
  const std::vector<Call> calls = iteration_calls(w);
  ASSERT_EQ(calls.size(), 6u);
  const std::vector<double> seconds = {10, 1, 1, 2, 3, 4};
  // Everything on one set: one after another, plus the controller's 0.5 s.
  std::vector<int> one(6, 0);
  ScheduleInput in;
  in.calls = &calls;
  in.set_of_call = one.data();
  in.seconds_of_call = seconds.data();
  in.sets = 1;
  in.actor_set = in.rollout_set = 0;
  in.controller_s = 0.5;
  EXPECT_DOUBLE_EQ(schedule_iteration(in), 21.5);
  // Critic on set 1: its values (2) run beside the log-probs (1 + 1), its update (3) beside the actor's (4).
  std::vector<int> split = {0, 0, 0, 1, 1, 0};
  in.set_of_call = split.data();
  in.sets = 2;
  EXPECT_DOUBLE_EQ(schedule_iteration(in), 10 + 2 + 0.5 + 4);
  // Standalone rollout (set 2) with a 1 s weight sync: on-policy, everything waits for the sync.
  std::vector<int> standalone = {2, 0, 0, 1, 1, 0};
  in.set_of_call = standalone.data();
  in.sets = 3;
  in.rollout_set = 2;
  in.sync_s = 1;
  std::vector<ScheduledCall> spans;
  EXPECT_DOUBLE_EQ(schedule_iteration(in, &spans), 10 + 2 + 0.5 + 4 + 1);
  EXPECT_EQ(spans.size(), 8u);  // six calls, the controller, the sync
  // Staleness 1: the rollout generates the next batch while this one trains; the rollout's set is the
  // bottleneck (generation 10 + sync 1).
  in.staleness = 1;
  EXPECT_DOUBLE_EQ(schedule_iteration(in), 11);
}

// Staleness k with weight syncs every N updates, by hand. The rollout alone on set 1 (R seconds a batch),
// every other call on set 0: log-probs, reference and values (1 + 1 + 2) and the two updates (3 + 4), so
// training takes T = 11 s a step; a sync takes S = 1 s on both sets.
double async_period(double rollout_s, int staleness, int sync_every) {
  Workload w;
  w.reward_model = false;
  static const std::vector<Call> calls = iteration_calls(w);
  const std::vector<double> seconds = {rollout_s, 1, 1, 2, 3, 4};
  const std::vector<int> sets = {1, 0, 0, 0, 0, 0};
  ScheduleInput in;
  in.calls = &calls;
  in.set_of_call = sets.data();
  in.seconds_of_call = seconds.data();
  in.sets = 2;
  in.actor_set = 0;
  in.rollout_set = 1;
  in.sync_s = 1;
  in.staleness = staleness;
  in.sync_every = sync_every;
  return schedule_iteration(in);
}

TEST(Schedule, StalenessKPipelinesRolloutAndTrainingByHand) {
  const double T = 11, S = 1;
  // On-policy: generation, training and the sync one after another.
  EXPECT_DOUBLE_EQ(async_period(10, 0, 1), 10 + T + S);
  // A sync after every update: any k >= 1 reaches the busier set's work plus the sync, max(R, T) + S; a
  // deeper buffer cannot beat the bottleneck.
  for (int k : {1, 2, 4}) {
    EXPECT_DOUBLE_EQ(async_period(10, k, 1), T + S) << k;  // training-bound
    EXPECT_DOUBLE_EQ(async_period(12, k, 1), 12 + S) << k;  // rollout-bound
  }
  // A fast rollout fills its buffer and pauses: k = 4 is no faster than k = 1.
  EXPECT_DOUBLE_EQ(async_period(4, 4, 1), async_period(4, 1, 1));
  // Syncs every N updates amortise: max(R, T) + S / N while N <= k.
  EXPECT_DOUBLE_EQ(async_period(10, 2, 2), T + S / 2);
  EXPECT_DOUBLE_EQ(async_period(10, 4, 4), T + S / 4);
  EXPECT_DOUBLE_EQ(async_period(12, 2, 2), 12 + S / 2);  // the rollout's set: 2R + S per two steps
  // N = k + 1: step N must wait for the sync that lets the rollout start its batch, a bubble of R every N
  // steps: (R + N T + S) / N.
  EXPECT_DOUBLE_EQ(async_period(10, 1, 2), (10 + 2 * T + S) / 2);
  EXPECT_NEAR(async_period(10, 4, 5), (10 + 5 * T + S) / 5, 1e-12);
}

TEST(Simulator, StalenessSweepPredictsTheAsyncSpeedup) {
  const ClusterSpec c = gpu_cluster("a100-80g", 16, 8);
  const ModelShape m = model_preset("qwen2.5-0.5b");
  const Workload w = ppo();
  Plan standalone;
  standalone.sets = {{{Role::kActor, Role::kRef, Role::kCritic, Role::kRewardModel}, 8}, {{Role::kRollout}, 8}};
  for (Role r : w.roles()) standalone.layout(r) = {1, 2, 4};
  standalone.sync_every = 2;
  const std::vector<StalenessPoint> points = staleness_sweep(standalone, c, m, w, {0, 1, 2, 4});
  ASSERT_EQ(points.size(), 4u);
  EXPECT_EQ(points[0].staleness, 0);
  EXPECT_DOUBLE_EQ(points[0].speedup, 1.0);
  EXPECT_EQ(points[0].sync_every, 1);  // N is at most k + 1
  EXPECT_EQ(points[2].sync_every, 2);
  Plan at0 = standalone;
  at0.sync_every = 1;
  EXPECT_DOUBLE_EQ(points[0].iteration_s, simulate(at0, c, m, w).iteration_s);
  for (size_t i = 1; i < points.size(); ++i) {
    EXPECT_GT(points[i].speedup, 1.0) << points[i].staleness;  // generation overlaps training
    EXPECT_NEAR(points[i].speedup, points[0].iteration_s / points[i].iteration_s, 1e-12);
  }
  // Bounded by the busier side: no speed-up beyond (R + T + S) / max(R + S, T + S / N) of the same calls.
  const Estimate e = simulate(at0, c, m, w);
  double R = 0, T = 0;
  for (const auto& call : e.calls) (call.set == 1 && call.name != "weight_sync" ? R : T) += call.cost.total();
  EXPECT_LE(points[3].iteration_s, e.iteration_s);
  EXPECT_GE(points[3].iteration_s, std::max(R, T - e.sync_s) - 1e-9);
  // The rollout on the actor's devices cannot run ahead: no sweep.
  EXPECT_TRUE(staleness_sweep(colocate_all(w, 16, {1, 2, 8}, {1, 2, 8}), c, m, w, {0, 1}).empty());
}

TEST(Simulator, ColocatedCallsAddUpAndSplitSetsOverlap) {
  const ClusterSpec c = gpu_cluster("a100-80g", 16, 8);
  const ModelShape m = model_preset("llama-7b");
  const Workload w = ppo();
  const Plan together = colocate_all(w, 16, {1, 2, 8}, {1, 2, 8});
  const Estimate e = simulate(together, c, m, w);
  ASSERT_TRUE(e.feasible) << e.why_not;
  double busy = 0;
  for (const auto& call : e.calls) busy += call.cost.total();
  EXPECT_NEAR(e.iteration_s, busy, 1e-9 * busy);  // one set: nothing overlaps
  EXPECT_NEAR(e.tokens_per_s, 256.0 * 1024 / e.iteration_s, 1e-6);
  // Actor, rollout and reference on 8 devices, critic and reward model on the other 8.
  Plan split;
  split.sets = {{{Role::kActor, Role::kRollout, Role::kRef}, 8}, {{Role::kCritic, Role::kRewardModel}, 8}};
  for (Role r : w.roles()) split.layout(r) = {1, 2, 4};
  const Estimate s = simulate(split, c, m, w);
  ASSERT_TRUE(s.feasible) << s.why_not;
  double split_busy = 0, set0 = 0;
  for (const auto& call : s.calls) {
    split_busy += call.cost.total();
    if (call.set == 0) set0 += call.cost.total();
  }
  EXPECT_LT(s.iteration_s, split_busy);  // the sets overlap
  EXPECT_GE(s.iteration_s, set0);        // but no set runs two calls at once
  EXPECT_EQ(split.placement_name(), "split");
}

TEST(Simulator, TheSwitchIsPaidOnlyWhenTheLayoutsDiffer) {
  const ClusterSpec c = gpu_cluster("a100-80g", 8, 8);
  const ModelShape m = model_preset("llama-7b");
  const Workload w = ppo();
  const Estimate same = simulate(colocate_all(w, 8, {1, 4, 2}, {1, 4, 2}), c, m, w);
  const Estimate switched = simulate(colocate_all(w, 8, {1, 4, 2}, {1, 1, 8}), c, m, w);
  ASSERT_TRUE(same.feasible && switched.feasible) << same.why_not << switched.why_not;
  EXPECT_EQ(same.reshard_s, 0.0);
  EXPECT_GT(switched.reshard_s, 0.0);
}

TEST(Simulator, MoreWorkTakesLonger) {
  const ClusterSpec c = gpu_cluster("a100-80g", 16, 8);
  const ModelShape m = model_preset("llama-7b");
  const Plan plan = colocate_all(ppo(), 16, {1, 2, 8}, {1, 2, 8});
  Workload w = ppo();
  const double base = simulate(plan, c, m, w).iteration_s;
  w.response_length = 1024;
  EXPECT_GT(simulate(plan, c, m, w).iteration_s, base);
  w = ppo();
  w.ppo_epochs = 2;
  EXPECT_GT(simulate(plan, c, m, w).iteration_s, base);
  w = ppo(512);
  EXPECT_GT(simulate(plan, c, m, w).iteration_s, base);
  // A bigger model of the same family on the same layout is slower.
  const Plan t8 = colocate_all(ppo(), 16, {1, 8, 2}, {1, 8, 2});
  const Estimate e7 = simulate(t8, c, m, ppo()), e13 = simulate(t8, c, model_preset("llama-13b"), ppo());
  ASSERT_TRUE(e7.feasible && e13.feasible) << e7.why_not << e13.why_not;
  EXPECT_GT(e13.iteration_s, e7.iteration_s);
}

TEST(Simulator, ImpossiblePlansSayWhy) {
  const ClusterSpec c = gpu_cluster("a100-80g", 8, 8);
  const Workload w = ppo();
  // 70B with every model on 8 A100s: the actor alone needs 16 bytes a parameter.
  const Estimate big = simulate(colocate_all(w, 8, {1, 8, 1}, {1, 8, 1}), c, model_preset("llama-70b"), w);
  EXPECT_FALSE(big.feasible);
  EXPECT_NE(big.why_not.find("GB per device"), std::string::npos) << big.why_not;
  // A layout that does not fill its set.
  Plan p = colocate_all(w, 8, {1, 2, 2}, {1, 2, 2});
  EXPECT_NE(simulate(p, c, model_preset("llama-7b"), w).why_not.find("devices"), std::string::npos);
  // Tensor parallelism beyond a node, stages that do not divide the layers.
  EXPECT_NE(layout_problem(gpu_cluster("a100-80g", 16, 8), model_preset("llama-7b"), w, Role::kActor, {1, 16, 1}, 16)
                .find("span nodes"),
            std::string::npos);
  EXPECT_NE(layout_problem(c, model_preset("llama-7b"), w, Role::kActor, {3, 1, 1}, 3).find("layers"), std::string::npos);
  // A role missing, and generation layouts that do not divide the actor's.
  Plan missing = colocate_all(w, 8, {1, 1, 8}, {1, 1, 8});
  missing.sets[0].roles.pop_back();
  EXPECT_NE(simulate(missing, c, model_preset("llama-7b"), w).why_not.find("placed 0 times"), std::string::npos);
  EXPECT_FALSE(simulate(colocate_all(w, 8, {1, 2, 4}, {1, 4, 2}), c, model_preset("llama-7b"), w).feasible);
}
