// Long sequences in the RL trainer. Ulysses sequence parallelism: PPO whose actor, reference and critic split
// every sequence over groups of 2 processes follows the run of the same seed on the same 2 processes without
// it (data parallel, the same generation replicas, so the same samples) within 1e-5: scores, losses, entropy,
// KL, values, gradient norms and the trained weights. Padding-free packing (use_remove_padding) follows the
// padded run alike, with fixed and with token-budget micro-batches, and together with sequence parallelism.
// Sequence-parallel groups inside tensor-parallel and pipeline layouts follow the data-parallel run too.
#include <gtest/gtest.h>

#include <cmath>

#include "hybridflow/runtime/worker_main.h"
#include "hybridflow/trainer/rl_trainer.h"
#include "hybridflow/workers/rl_workers.h"
#include "support/temp_dir.h"
#include "support/tiny_rl_config.h"

using namespace hybridflow;

static const bool kRanAsWorker = (register_rl_workers(), run_worker_if_requested());

namespace {

constexpr int kSpSteps = 2;
constexpr double kTol = 1e-5;

struct SpRun {
  std::vector<nlohmann::json> steps;
  double actor_norm = 0, critic_norm = 0;
};

// PPO (or GRPO in `more`, with_critic false) on 2 colocated processes, 2 prompts x 2 samples a step; every role's
// sequences split `sp` ways.
SpRun train_ppo(int sp, const std::vector<std::string>& more = {}, bool with_critic = true) {
  hybridflow::testing::TempDir dir;
  const std::string s = std::to_string(sp);
  std::vector<std::string> extra = {
      // 4 query heads over 2 KV heads: one KV head (and its 2 query heads) per rank of a group of 2.
      "model.num_attention_heads=4",
      "model.num_key_value_heads=2",
      "actor_rollout_ref.num_processes=2",
      "trainer.placement=colocate",
      "actor_rollout_ref.actor.use_kl_loss=true",
      "actor_rollout_ref.actor.shuffle=false",
      "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
      "critic.shuffle=false",
      "critic.ppo_micro_batch_size_per_gpu=1",
      "actor_rollout_ref.actor.ulysses_sequence_parallel_size=" + s,
      "critic.ulysses_sequence_parallel_size=" + s,
      "trainer.total_steps=" + std::to_string(kSpSteps),
      "trainer.log_samples_freq=0",
      "trainer.run_dir=" + dir.path()};
  extra.insert(extra.end(), more.begin(), more.end());
  RLTrainer trainer(load_rl_config("", hybridflow::testing::tiny_rl_overrides("gae", extra)));
  SpRun run;
  for (int step = 1; step <= kSpSteps; ++step) run.steps.push_back(trainer.step());
  run.actor_norm = trainer.parameter_sq_norm("actor");
  if (with_critic) run.critic_norm = trainer.parameter_sq_norm("critic");
  return run;
}

void expect_same_run(const SpRun& got, const SpRun& want, const std::string& what, bool split = true) {
  ASSERT_EQ(got.steps.size(), want.steps.size());
  for (size_t i = 0; i < want.steps.size(); ++i) {
    const std::string at = what + " at step " + std::to_string(i + 1);
    std::vector<std::string> keys = {"score/mean",    "response_length/mean", "actor/pg_loss", "actor/kl_loss",
                                     "actor/entropy", "actor/ppo_kl",         "actor/grad_norm"};
    if (want.critic_norm > 0) keys.insert(keys.end(), {"critic/vpred_mean", "critic/vf_loss", "critic/grad_norm"});
    for (const std::string& key : keys) {
      ASSERT_TRUE(got.steps[i].contains(key)) << key << " " << at;
      const double w = want.steps[i].at(key).get<double>();
      EXPECT_NEAR(got.steps[i].at(key).get<double>(), w, kTol * (1 + std::abs(w))) << key << " " << at;
    }
  }
  EXPECT_GT(want.steps.back().at("actor/kl_loss").get<double>(), 0.0) << "the actor moved";
  // The split run traded sequence and head splits (and the other did not).
  for (const std::string role : {"actor", "critic"}) {
    if (!split || (role == "critic" && want.critic_norm == 0)) continue;
    const std::string key = role + "/sequence_parallel_all_to_all_mb";
    EXPECT_FALSE(want.steps.back().contains(key)) << key;
    ASSERT_TRUE(got.steps.back().contains(key)) << key << " " << what;
    EXPECT_GT(got.steps.back().at(key).get<double>(), 0.0) << key << " " << what;
  }
  EXPECT_NEAR(got.actor_norm, want.actor_norm, kTol * want.actor_norm) << what;
  EXPECT_NEAR(got.critic_norm, want.critic_norm, kTol * want.critic_norm) << what;
}

}  // namespace

TEST(RlSequenceParallel, PpoWithSequencesSplitTwoWaysFollowsTheDataParallelRun) {
  const SpRun data_parallel = train_ppo(1);
  const SpRun split = train_ppo(2);
  expect_same_run(split, data_parallel, "sp 2");
}

TEST(RlSequenceParallel, GrpoWithActivationCheckpointingFollowsTheDataParallelRun) {
  // A reward that differs between a prompt's samples (digits in the response), so GRPO's advantages do not vanish.
  const std::vector<std::string> more = {
      "algorithm.adv_estimator=grpo", "actor_rollout_ref.model.enable_gradient_checkpointing=true",
      "reward.type=command",
      "reward.shell=/usr/bin/python3 -c \"import sys,json; [print(sum(c.isdigit() for c in "
      "json.loads(l)['response']) / 4.0, flush=True) for l in sys.stdin]\""};
  const SpRun data_parallel = train_ppo(1, more, /*with_critic=*/false);
  const SpRun split = train_ppo(2, more, /*with_critic=*/false);
  expect_same_run(split, data_parallel, "grpo, sp 2, checkpointing");
}

// Sequence-parallel groups inside tensor-parallel and pipeline layouts: 4 processes generating in 2 replicas
// (tensor-parallel pairs, or two-stage pipelines), each replica's pair of data-parallel ranks training as one
// sequence-parallel group, follow the 2-process data-parallel run (the same 2 generation replicas, so the same
// samples). The tensor-parallel run asks for its groups as verl's Megatron configs do (context_parallel_size);
// there a rank holds 2 query heads and 1 KV head, which its group repeats.
TEST(RlSequenceParallel, GrpoSplitInsideTensorAndPipelineLayoutsFollowsTheDataParallelRun) {
  const std::vector<std::string> grpo = {
      "algorithm.adv_estimator=grpo", "model.num_hidden_layers=2", "reward.type=command",
      "reward.shell=/usr/bin/python3 -c \"import sys,json; [print(sum(c.isdigit() for c in "
      "json.loads(l)['response']) / 4.0, flush=True) for l in sys.stdin]\""};
  const auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), grpo.begin(), grpo.end());
    return more;
  };
  const SpRun data_parallel = train_ppo(1, grpo, /*with_critic=*/false);
  const SpRun tensor = train_ppo(1,
                                 with({"actor_rollout_ref.num_processes=4",
                                       "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
                                       "actor_rollout_ref.actor.megatron.context_parallel_size=2"}),
                                 /*with_critic=*/false);
  expect_same_run(tensor, data_parallel, "grpo, context_parallel_size 2 x tp 2");
  const SpRun stages = train_ppo(2,
                                 with({"actor_rollout_ref.num_processes=4",
                                       "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2",
                                       "actor_rollout_ref.rollout.pipeline_model_parallel_size=2"}),
                                 /*with_critic=*/false);
  expect_same_run(stages, data_parallel, "grpo, sp 2 x pp 2");
}

TEST(RlSequenceParallel, AReferenceSplitOtherwiseThanTheActorIsRefusedNamingTheKeys) {
  try {
    train_ppo(2, {"actor_rollout_ref.ref.ulysses_sequence_parallel_size=1"});
    ADD_FAILURE() << "a reference split otherwise than the actor was accepted";
  } catch (const std::exception& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("actor_rollout_ref.ref.ulysses_sequence_parallel_size = 1"), std::string::npos) << message;
    EXPECT_NE(message.find("actor_rollout_ref.actor.ulysses_sequence_parallel_size = 2"), std::string::npos) << message;
  }
}

TEST(RlSequenceParallel, PackedRowsFollowThePaddedRun) {
  // Micro-batches of 2 rows: a packed row then holds two sequences.
  const std::vector<std::string> two_rows = {"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
                                             "critic.ppo_micro_batch_size_per_gpu=2"};
  std::vector<std::string> packed = two_rows;
  packed.insert(packed.end(), {"actor_rollout_ref.model.use_remove_padding=true", "critic.model.use_remove_padding=true"});
  const SpRun padded = train_ppo(1, two_rows);
  expect_same_run(train_ppo(1, packed), padded, "packed", /*split=*/false);
  expect_same_run(train_ppo(2, packed), padded, "packed, sp 2");
}

TEST(RlSequenceParallel, PackedTokenBudgetMicroBatchesFollowThePaddedOnes) {
  const std::vector<std::string> by_tokens = {"actor_rollout_ref.actor.use_dynamic_bsz=true",
                                              "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=64"};
  std::vector<std::string> packed = by_tokens;
  packed.insert(packed.end(), {"actor_rollout_ref.model.use_remove_padding=true", "critic.model.use_remove_padding=true"});
  expect_same_run(train_ppo(1, packed), train_ppo(1, by_tokens), "packed by tokens", /*split=*/false);
}

// The shipped long-sequence example (examples/grpo_long_sp2.yaml) loads and trains with its own settings
// (GRPO, sequences split over 2 processes, packed rows, its cut-down Qwen2.5 shape), at shorter prompts and
// responses so that a step takes seconds; its full length was run and timed by hand (the example says how long).
TEST(RlSequenceParallel, TheLongSequenceExampleTrainsAStepSplitTwoWays) {
  hybridflow::testing::TempDir dir;
  RLTrainer trainer(load_rl_config(std::string(HF_SOURCE_DIR) + "/examples/grpo_long_sp2.yaml",
                                   {"data.min_length=48", "data.max_length=64",
                                    "actor_rollout_ref.rollout.response_length=8", "trainer.run_dir=" + dir.path()}));
  const nlohmann::json step = trainer.step();
  ASSERT_TRUE(step.contains("actor/sequence_parallel_all_to_all_mb")) << step.dump();
  EXPECT_GT(step.at("actor/sequence_parallel_all_to_all_mb").get<double>(), 0.0);
  EXPECT_TRUE(std::isfinite(step.at("actor/grad_norm").get<double>()));
  EXPECT_GE(step.at("prompt_length/mean").get<double>(), 48.0);
}
