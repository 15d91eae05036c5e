// Each of verl's newer policy losses, chosen by actor_rollout_ref.actor.policy_loss.loss_mode with its own
// parameters, trains a tiny PPO run (GAE against a critic, so the advantages are not all 0 while the untrained
// model scores nothing) for two steps end to end: the keys reach the actor, the loss gives the actor a
// gradient, and the metrics it reports come back (the covariance share for clip_cov and kl_cov).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "hybridflow/runtime/worker_main.h"
#include "hybridflow/trainer/rl_trainer.h"
#include "hybridflow/workers/rl_workers.h"
#include "support/error_of.h"
#include "support/tiny_rl_config.h"

using namespace hybridflow;
using hybridflow::testing::tiny_rl_overrides;

static const bool kRanAsWorker = (register_rl_workers(), run_worker_if_requested());

namespace {

struct LossCase {
  const char* mode;
  std::vector<std::string> params;
  bool reports_cov_frac;
};

class RlPolicyLosses : public ::testing::TestWithParam<LossCase> {};

TEST_P(RlPolicyLosses, TwoStepsTrainAndReportTheLossMetrics) {
  const LossCase& c = GetParam();
  std::vector<std::string> overrides = {"trainer.total_steps=2", "data.train_batch_size=4",
                                        "actor_rollout_ref.rollout.response_length=8",
                                        std::string("actor_rollout_ref.actor.policy_loss.loss_mode=") + c.mode};
  overrides.insert(overrides.end(), c.params.begin(), c.params.end());
  RLTrainer trainer(load_rl_config("", tiny_rl_overrides("gae", overrides)));
  const double before = trainer.parameter_sq_norm("actor");
  for (int step = 0; step < 2; ++step) {
    const nlohmann::json m = trainer.step();
    ASSERT_TRUE(m.contains("actor/grad_norm")) << m.dump();
    EXPECT_GT(m.at("actor/grad_norm").get<double>(), 0.0) << c.mode << ": the loss gave no gradient";
    for (const char* key : {"actor/pg_loss", "actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl"}) {
      ASSERT_TRUE(m.contains(key)) << c.mode << ": " << key << " missing in " << m.dump();
      EXPECT_TRUE(std::isfinite(m.at(key).get<double>())) << c.mode << ": " << key;
    }
    EXPECT_EQ(m.contains("actor/pg_cov_frac"), c.reports_cov_frac) << c.mode << ": " << m.dump();
    if (c.reports_cov_frac) {
      const double share = m.at("actor/pg_cov_frac").get<double>();
      EXPECT_GT(share, 0.0) << c.mode;  // at least one token a micro-batch
      EXPECT_LE(share, 1.0) << c.mode;
    }
  }
  const double after = trainer.parameter_sq_norm("actor");
  EXPECT_TRUE(std::isfinite(after)) << c.mode;
  EXPECT_NE(after, before) << c.mode << ": two steps left the actor unchanged";
}

INSTANTIATE_TEST_SUITE_P(
    Modes, RlPolicyLosses,
    ::testing::Values(LossCase{"cispo", {"actor_rollout_ref.actor.clip_ratio_low=10", "actor_rollout_ref.actor.clip_ratio_high=0.28"}, false},
                      LossCase{"sapo", {"actor_rollout_ref.actor.tau_pos=1.0", "actor_rollout_ref.actor.tau_neg=1.05"}, false},
                      LossCase{"geo_mean", {"actor_rollout_ref.actor.clip_ratio=0.4"}, false},
                      LossCase{"clip_cov",
                               {"actor_rollout_ref.actor.policy_loss.clip_cov_ratio=0.01",
                                "actor_rollout_ref.actor.policy_loss.clip_cov_lb=0.0",
                                "actor_rollout_ref.actor.policy_loss.clip_cov_ub=100.0"},
                               true},
                      LossCase{"kl_cov",
                               {"actor_rollout_ref.actor.policy_loss.kl_cov_ratio=0.01",
                                "actor_rollout_ref.actor.policy_loss.ppo_kl_coef=0.1"},
                               true},
                      LossCase{"dppo_tv", {"actor_rollout_ref.actor.clip_ratio=0.2", "actor_rollout_ref.actor.clip_ratio_c=20"}, false},
                      LossCase{"dppo_kl", {"actor_rollout_ref.actor.clip_ratio=0.05", "actor_rollout_ref.actor.clip_ratio_c=20"}, false},
                      LossCase{"gpg", {}, false}),
    [](const ::testing::TestParamInfo<LossCase>& info) { return std::string(info.param.mode); });

}  // namespace

namespace {

// verl's rollout correction reaches the actor: rejecting every token (bounds that exclude ratio 1, where the
// actor's old policy equals the rollout's) leaves the policy loss nothing, so the actor's step is skipped
// and the actor is unchanged, while the critic trains; the rejection is logged.
TEST(RlRolloutCorrection, RejectingEveryTokenLeavesTheActorNoGradient) {
  RLTrainer trainer(load_rl_config(
      "", tiny_rl_overrides("gae", {"trainer.total_steps=1", "data.train_batch_size=4",
                                    "actor_rollout_ref.rollout.response_length=8",
                                    "algorithm.rollout_correction.rollout_rs=geometric",
                                    "algorithm.rollout_correction.rollout_rs_threshold=0.5",
                                    "algorithm.rollout_correction.rollout_rs_threshold_lower=0.25"})));
  const double before = trainer.parameter_sq_norm("actor");
  const nlohmann::json m = trainer.step();
  ASSERT_TRUE(m.contains("rollout_corr/rejected_fraction")) << m.dump();
  EXPECT_EQ(m.at("rollout_corr/rejected_fraction").get<double>(), 1.0);
  EXPECT_EQ(m.at("rollout_corr/rollout_rs_seq_masked_fraction").get<double>(), 1.0);
  ASSERT_TRUE(m.contains("actor/empty_steps")) << m.dump();
  EXPECT_EQ(trainer.parameter_sq_norm("actor"), before);
  EXPECT_EQ(m.at("train/nonfinite_updates").get<double>(), 0.0) << "an empty step is not a non-finite one";
  EXPECT_GT(m.at("critic/grad_norm").get<double>(), 0.0) << "the critic keeps the whole batch";
}

// Bypass mode with verl's REINFORCE loss: the weights and the rejection are taken in the actor against the
// current policy, whose metrics come back from it, and the actor trains.
TEST(RlRolloutCorrection, BypassReinforceTrainsWithTheActorsCorrection) {
  RLTrainer trainer(load_rl_config(
      "", tiny_rl_overrides("gae", {"trainer.total_steps=1", "data.train_batch_size=4",
                                    "actor_rollout_ref.rollout.response_length=8",
                                    "algorithm.rollout_correction.bypass_mode=true",
                                    "algorithm.rollout_correction.loss_type=reinforce",
                                    "algorithm.rollout_correction.rollout_is=sequence",
                                    "algorithm.rollout_correction.rollout_rs=token",
                                    "algorithm.rollout_correction.rollout_rs_threshold=10"})));
  const double before = trainer.parameter_sq_norm("actor");
  const nlohmann::json m = trainer.step();
  for (const char* key : {"rollout_corr/rollout_is_mean", "rollout_corr/rollout_is_eff_sample_size",
                          "rollout_corr/rollout_rs_masked_fraction", "rollout_corr/rejected_fraction"})
    ASSERT_TRUE(m.contains(key)) << key << " missing in " << m.dump();
  // The first micro-batch's policy is the rollout's: its weights are 1 up to rounding, nothing is rejected.
  EXPECT_NEAR(m.at("rollout_corr/rejected_fraction").get<double>(), 0.0, 1e-9);
  EXPECT_GT(m.at("actor/grad_norm").get<double>(), 0.0);
  EXPECT_NE(trainer.parameter_sq_norm("actor"), before);
}

// verl's chained divergence criteria (its multi_rs example's setting) reach the actor in bypass mode: a
// token_k1 window that excludes ratio 1 rejects every token (the policy is the rollout's up to rounding), a
// loose seq_max_k2 none, and the per-criterion metrics come back from the actor.
TEST(RlRolloutCorrection, ChainedDivergenceCriteriaReachTheActorInBypassMode) {
  RLTrainer trainer(load_rl_config(
      "", tiny_rl_overrides("gae", {"trainer.total_steps=1", "data.train_batch_size=4",
                                    "actor_rollout_ref.rollout.response_length=8",
                                    "algorithm.rollout_correction.bypass_mode=true",
                                    "algorithm.rollout_correction.rollout_rs='token_k1,seq_max_k2'",
                                    "algorithm.rollout_correction.rollout_rs_threshold='1.5_2,2.5'"})));
  const nlohmann::json m = trainer.step();
  for (const char* key : {"rollout_corr/rollout_rs_token_k1_masked_fraction",
                          "rollout_corr/rollout_rs_seq_max_k2_seq_masked_fraction", "rollout_corr/rejected_fraction"})
    ASSERT_TRUE(m.contains(key)) << key << " missing in " << m.dump();
  EXPECT_NEAR(m.at("rollout_corr/rollout_rs_token_k1_masked_fraction").get<double>(), 1.0, 1e-9);
  EXPECT_NEAR(m.at("rollout_corr/rollout_rs_seq_max_k2_masked_fraction").get<double>(), 0.0, 1e-9);
  EXPECT_NEAR(m.at("rollout_corr/rejected_fraction").get<double>(), 1.0, 1e-9);
}

TEST(RlRolloutCorrection, ReinforceOutsideBypassModeIsRefused) {
  using hybridflow::testing::error_of;
  const std::string error = error_of([] {
    RLTrainer trainer(load_rl_config("", tiny_rl_overrides("gae", {"algorithm.rollout_correction.loss_type=reinforce"})));
  });
  EXPECT_NE(error.find("bypass_mode"), std::string::npos) << error;
}

}  // namespace
