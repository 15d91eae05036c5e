// Algorithms as programs (trainer/rl_program.h): which program a config runs, a program registered from
// outside the library, and the baselines of ReMax and Safe-RLHF scored like the samples they are
// compared with.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "hybridflow/core/error.h"
#include "hybridflow/runtime/worker_main.h"
#include "hybridflow/trainer/rl_program.h"
#include "hybridflow/trainer/rl_trainer.h"
#include "hybridflow/workers/rl_workers.h"
#include "support/error_of.h"
#include "support/tiny_rl_config.h"

using namespace hybridflow;
using hybridflow::testing::error_of;
using hybridflow::testing::tiny_rl_overrides;

static const bool kRanAsWorker = (register_rl_workers(), run_worker_if_requested());

namespace {

std::string program_of(const std::vector<std::string>& overrides) {
  return rl_program_name(load_rl_config("", overrides));
}

}  // namespace

TEST(RlPrograms, AutoPicksTheProgramOfTheSettings) {
  EXPECT_EQ(program_of({"algorithm.adv_estimator=gae"}), "ppo");
  for (const char* name : {"grpo", "rloo", "remax", "reinforce_plus_plus"})
    EXPECT_EQ(program_of({std::string("algorithm.adv_estimator=") + name}), name);
  EXPECT_EQ(program_of({"algorithm.adv_estimator=grpo", "cost.type=contains", "cost.contains=[x]"}), "safe_rlhf");
  EXPECT_EQ(program_of({"algorithm.adv_estimator=gae", "cost_model.enable=true"}), "safe_rlhf");
  EXPECT_EQ(program_of({"algorithm.adv_estimator=grpo", "algorithm.filter_groups.enable=true"}), "dapo");
  EXPECT_EQ(program_of({"algorithm.adv_estimator=rloo", "algorithm.program=grpo"}), "grpo");
  algo::register_advantage_estimator("test_only_estimator", algo::compute_grpo_advantage);
  EXPECT_EQ(program_of({"algorithm.adv_estimator=test_only_estimator"}), "policy_gradient");
}

TEST(RlPrograms, AnUnknownProgramIsAnErrorListingTheKnownOnes) {
  const std::string bad = error_of([] { program_of({"algorithm.program=ppo2"}); });
  EXPECT_NE(bad.find("algorithm.program: unknown program 'ppo2'"), std::string::npos) << bad;
  EXPECT_NE(bad.find("remax"), std::string::npos) << bad;
  EXPECT_NE(bad.find("safe_rlhf"), std::string::npos) << bad;
}

// A program registered by the binary runs under the stock trainer; one that forgets to end its step is
// caught instead of silently not counting it.
TEST(RlPrograms, ARegisteredProgramRunsAndMustFinishItsStep) {
  int calls = 0;
  register_rl_program("test_all_zero", [&calls](RLStages& rl) {
    ++calls;
    Rollout r = rl.rollout(rl.next_prompts());
    rl.score(r);
    rl.collect(r);
    algo::AdvantageInput in = rl.advantage_input(r, rl.token_rewards(r));
    const auto zero = torch::zeros_like(in.response_mask);
    rl.set_advantages(r, {zero, zero});
    rl.update(r);
    return rl.finish(r);
  });
  RLTrainer trainer(load_rl_config("", tiny_rl_overrides("grpo", {"algorithm.program=test_all_zero"})));
  const nlohmann::json record = trainer.step();
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(trainer.steps_done(), 1);
  EXPECT_EQ(record.at("advantages/mean").get<double>(), 0.0) << record.dump();
  // Zero advantages and no KL or entropy term: the policy loss and its gradient are 0.
  EXPECT_EQ(record.at("actor/pg_loss").get<double>(), 0.0) << record.dump();

  register_rl_program("test_unfinished", [](RLStages& rl) {
    rl.rollout(rl.next_prompts());
    return nlohmann::json::object();
  });
  RLTrainer unfinished(load_rl_config("", tiny_rl_overrides("grpo", {"algorithm.program=test_unfinished"})));
  const std::string bad = error_of([&] { unfinished.step(); });
  EXPECT_NE(bad.find("returned without ending its step"), std::string::npos) << bad;
  EXPECT_EQ(unfinished.steps_done(), 0);
}

// With top_k = 1 a sampled response is the greedy one, so a baseline scored like the samples cancels them
// exactly: every ReMax advantage is 0. Here the only reward is the reward model's (no rule reward). A
// baseline of the greedy responses' rule scores alone (0 here) would leave the reward model's scores.
TEST(RlPrograms, RemaxBaselineIsTheGreedyResponsesFullScore) {
  RLTrainer trainer(load_rl_config(
      "", tiny_rl_overrides("remax", {"reward.type=none", "reward_model.enable=true", "actor_rollout_ref.rollout.top_k=1",
                                      "trainer.total_steps=1"})));
  const nlohmann::json record = trainer.step();
  const double baseline = record.at("score/greedy_baseline_mean").get<double>();
  EXPECT_GT(std::abs(record.at("score/rm_mean").get<double>()), 1e-4) << record.dump();
  EXPECT_NEAR(baseline, record.at("score/mean").get<double>(), 1e-6) << record.dump();
  EXPECT_NEAR(record.at("advantages/mean").get<double>(), 0.0, 1e-6) << record.dump();
}

// Safe-RLHF with the ReMax estimator: the cost baseline is the greedy responses' cost (cost model, no
// rule cost), so with greedy-equal samples the cost advantages vanish too.
TEST(RlPrograms, SafeRlhfCostBaselineIsTheGreedyResponsesFullCost) {
  RLTrainer trainer(load_rl_config(
      "", tiny_rl_overrides("remax", {"reward.type=none", "reward_model.enable=true", "cost_model.enable=true",
                                      "actor_rollout_ref.rollout.top_k=1", "trainer.total_steps=1"})));
  const nlohmann::json record = trainer.step();
  EXPECT_GT(std::abs(record.at("cost/mean").get<double>()), 1e-4) << record.dump();
  EXPECT_NEAR(record.at("cost_advantages/mean").get<double>(), 0.0, 1e-6) << record.dump();
  EXPECT_NEAR(record.at("advantages/mean").get<double>(), 0.0, 1e-6) << record.dump();
}

// DAPO's dynamic sampling drops groups whose samples all score the same. With no reward at all every group
// does, so no batch can be filled: after max_num_gen_batches rounds the step stops with a clear error.
TEST(RlPrograms, DapoDropsUniformGroupsAndGivesUpAfterMaxRounds) {
  RLTrainer uniform(load_rl_config(
      "", tiny_rl_overrides("grpo", {"reward.type=none", "algorithm.filter_groups.enable=true",
                                     "algorithm.filter_groups.max_num_gen_batches=2"})));
  const std::string bad = error_of([&] { uniform.step(); });
  EXPECT_NE(bad.find("max_num_gen_batches = 2"), std::string::npos) << bad;
  EXPECT_NE(bad.find("only 0 of data.train_batch_size = 2"), std::string::npos) << bad;

  // A reward model scores every distinct response differently: groups vary and the batch fills.
  RLTrainer varied(load_rl_config(
      "", tiny_rl_overrides("grpo", {"reward.type=none", "reward_model.enable=true", "algorithm.filter_groups.enable=true",
                                     "data.gen_batch_size=2", "actor_rollout_ref.rollout.temperature=2.0"})));
  const nlohmann::json record = varied.step();
  EXPECT_GE(record.at("dapo/num_gen_batches").get<double>(), 1.0) << record.dump();
  const double kept = record.at("dapo/kept_group_fraction").get<double>();
  EXPECT_GT(kept, 0.0) << record.dump();
  EXPECT_LE(kept, 1.0) << record.dump();
  EXPECT_EQ(varied.steps_done(), 1);
}
