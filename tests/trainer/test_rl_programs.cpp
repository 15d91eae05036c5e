// Algorithms as programs (trainer/rl_program.h): which program a config runs, a program registered from
// outside the library, the role handles it gets, the checks at setup, and the baselines of ReMax and Safe-RLHF scored like the samples they are
// compared with.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

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
  EXPECT_EQ(program_of({"algorithm.adv_estimator=reinforce_plus_plus_baseline"}), "policy_gradient");
  EXPECT_EQ(program_of({"algorithm.adv_estimator=gpg"}), "policy_gradient");
}

// verl's examples run GPG as adv_estimator gpg with loss_mode gpg, and REINFORCE++ with a group baseline: a step
// of each trains the actor on a reward that differs between samples, with no critic.
TEST(RlPrograms, VerlsGpgAndReinforcePlusPlusBaselineTrainTheActor) {
  for (const std::vector<std::string>& setting :
       {std::vector<std::string>{"algorithm.adv_estimator=gpg", "actor_rollout_ref.actor.policy_loss.loss_mode=gpg"},
        std::vector<std::string>{"algorithm.adv_estimator=reinforce_plus_plus_baseline"}}) {
    std::vector<std::string> o = {"trainer.total_steps=1", "data.train_batch_size=4", "actor_rollout_ref.rollout.n=4",
                                  "actor_rollout_ref.rollout.response_length=8", "trainer.log_samples_freq=0",
                                  "reward.type=command",
                                  "reward.shell=/usr/bin/python3 -c \"import sys,json\nfor l in sys.stdin: "
                                  "print(len(json.loads(l)['response']) % 3 / 2.0, flush=True)\""};
    o.insert(o.end(), setting.begin(), setting.end());
    RLTrainer trainer(load_rl_config("", tiny_rl_overrides("grpo", o)));
    EXPECT_EQ(trainer.roles(), (std::vector<std::string>{"actor"})) << setting[0];
    const double before = trainer.parameter_sq_norm("actor");
    const nlohmann::json m = trainer.step();
    EXPECT_GT(m.at("actor/grad_norm").get<double>(), 0.0) << setting[0] << ": " << m.dump();
    EXPECT_NE(trainer.parameter_sq_norm("actor"), before) << setting[0];
  }
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
  register_rl_program("test_all_zero", [&calls](RLStep& step) {
    ++calls;
    auto& [actor, ref, critic, reward, cost, cost_critic] = step.roles();
    EXPECT_FALSE(critic.has_value());  // grpo: no critic, and no cost
    EXPECT_FALSE(cost.has_value());
    RolloutBatch batch = actor.generate_sequences(step.next_prompts());
    Pending scores = reward.compute_reward(batch);
    Pending old_log_prob = actor.compute_log_prob(batch);
    join(scores, old_log_prob);
    const algo::AdvantageInput in = step.advantage_input(batch);
    const auto zero = torch::zeros_like(in.response_mask);
    batch.set_advantages({zero, zero});
    actor.update_actor(batch).join();
    return step.finish(batch);
  });
  RLTrainer trainer(load_rl_config("", tiny_rl_overrides("grpo", {"algorithm.program=test_all_zero"})));
  const nlohmann::json record = trainer.step();
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(trainer.steps_done(), 1);
  EXPECT_EQ(record.at("advantages/mean").get<double>(), 0.0) << record.dump();
  // Zero advantages and no KL or entropy term: the policy loss and its gradient are 0.
  EXPECT_EQ(record.at("actor/pg_loss").get<double>(), 0.0) << record.dump();
  EXPECT_TRUE(record.contains("score/mean")) << record.dump();

  register_rl_program("test_unfinished", [](RLStep& step) {
    step.roles().actor.generate_sequences(step.next_prompts()).data();
    return nlohmann::json::object();
  });
  RLTrainer unfinished(load_rl_config("", tiny_rl_overrides("grpo", {"algorithm.program=test_unfinished"})));
  const std::string bad = error_of([&] { unfinished.step(); });
  EXPECT_NE(bad.find("returned without ending its step"), std::string::npos) << bad;
  EXPECT_EQ(unfinished.steps_done(), 0);
}

// The handles are the roles the configuration runs: a critic with gae, a reference with a KL term, a cost
// and cost critic with a cost under gae. The program sees the same set the trainer started.
TEST(RlPrograms, TheHandlesAreTheConfiguredRoles) {
  struct Seen {
    bool ref = false, critic = false, cost = false, cost_critic = false;
  };
  Seen seen;
  register_rl_program("test_roles", [&seen](RLStep& step) {
    const RLRoles& roles = step.roles();
    seen = {roles.ref.has_value(), roles.critic.has_value(), roles.cost.has_value(), roles.cost_critic.has_value()};
    return get_rl_program("ppo")(step);
  });
  RLTrainer plain(load_rl_config("", tiny_rl_overrides("gae", {"algorithm.program=test_roles"})));
  plain.step();
  EXPECT_TRUE(seen.critic);
  EXPECT_FALSE(seen.cost);
  EXPECT_FALSE(seen.cost_critic);
  RLTrainer with_kl(load_rl_config("", tiny_rl_overrides("gae", {"algorithm.program=test_roles",
                                                                 "actor_rollout_ref.actor.use_kl_loss=true"})));
  with_kl.step();
  EXPECT_TRUE(seen.ref);
}

// What a program needs of the configuration fails when the trainer is built, naming the key, not at the
// first step after every worker started.
TEST(RlPrograms, AProgramsConfigurationIsCheckedAtSetup) {
  const std::string remax_in_dapo = error_of([] {
    RLTrainer t(load_rl_config("", tiny_rl_overrides("remax", {"algorithm.filter_groups.enable=true"})));
  });
  EXPECT_NE(remax_in_dapo.find("algorithm.adv_estimator: remax"), std::string::npos) << remax_in_dapo;
  const std::string metric = error_of([] {
    RLTrainer t(load_rl_config("", tiny_rl_overrides("grpo", {"algorithm.filter_groups.enable=true",
                                                              "algorithm.filter_groups.metric=seq_final_reward"})));
  });
  EXPECT_NE(metric.find("algorithm.filter_groups.metric"), std::string::npos) << metric;
  const std::string no_cost = error_of([] {
    RLTrainer t(load_rl_config("", tiny_rl_overrides("grpo", {"algorithm.program=safe_rlhf"})));
  });
  EXPECT_NE(no_cost.find("safe_rlhf needs a cost"), std::string::npos) << no_cost;
  // A user's program registers its own check.
  register_rl_program(
      "test_checked", get_rl_program("grpo"),
      [](const Config& c) { HF_CHECK(c.get<int64_t>("actor_rollout_ref.rollout.n") > 1, "test_checked: rollout.n"); });
  EXPECT_NO_THROW(check_rl_program("test_checked", load_rl_config("", {"actor_rollout_ref.rollout.n=2"})));
  const std::string one = error_of([] { check_rl_program("test_checked", load_rl_config("", {})); });
  EXPECT_NE(one.find("test_checked: rollout.n"), std::string::npos) << one;
}

// A program talks to worker groups only through the role handles: none of the built-ins may reach into a
// worker's header (what it would need there belongs in a handle or in the step).
TEST(RlPrograms, NoBuiltInProgramIncludesAWorkerHeader) {
  int programs = 0;
  for (const auto& entry : std::filesystem::directory_iterator(std::string(HF_SOURCE_DIR) + "/src/trainer/programs")) {
    std::ifstream in(entry.path());
    std::stringstream text;
    text << in.rdbuf();
    EXPECT_EQ(text.str().find("hybridflow/workers/"), std::string::npos) << entry.path();
    ++programs;
  }
  EXPECT_GE(programs, 4);
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
