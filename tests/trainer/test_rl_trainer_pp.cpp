// The RL trainer with pipeline-parallel roles on 4 processes: PPO whose actor (with its reference) runs two
// stages of two tensor-parallel ranks and generates unstaged and unsplit through the 3D-HybridEngine, whose
// critic runs two stages over two data-parallel groups and whose reward model runs two stages of two ranks,
// follows the all-data-parallel run of the same seed step for step; the switch moves every weight the
// rank's stage lacks and holds nothing twice; a staged run with the ZeRO optimizer checkpoints into one
// Hugging Face directory (which loads unstaged) and one optimizer file, and resumes staged or unstaged.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "hybridflow/model/pretrained.h"
#include "hybridflow/runtime/worker_main.h"
#include "hybridflow/trainer/rl_trainer.h"
#include "hybridflow/workers/model_spec.h"
#include "hybridflow/workers/rl_workers.h"
#include "support/error_of.h"
#include "support/temp_dir.h"
#include "trainer/parallel_ppo_fixture.h"

using namespace hybridflow;
using namespace hybridflow::testing;

static const bool kRanAsWorker = (register_rl_workers(), run_worker_if_requested());

namespace {

// Every role in pp stages of tp ranks (tp = 1 for the critic: it trains over two data-parallel groups).
std::vector<std::string> staged(const std::string& rm, int pp, int tp, std::vector<std::string> extra = {}) {
  const std::string p = std::to_string(pp);
  extra.insert(extra.begin(), {"model.num_hidden_layers=2",
                               "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=" + p,
                               "critic.megatron.pipeline_model_parallel_size=" + p,
                               "critic.megatron.tensor_model_parallel_size=1",
                               "reward_model.megatron.pipeline_model_parallel_size=" + p});
  return ppo_on_four(rm, tp, 1, extra);
}

}  // namespace

TEST(RlTrainerPipelineParallel, PpoInTwoStagesFollowsTheDataParallelRun) {
  TempDir dir;
  const std::string rm = write_reward_model(dir.path() + "/rm", /*layers=*/2);
  RLTrainer piped(load_rl_config("", staged(rm, 2, 2)));
  RLTrainer plain(load_rl_config("", staged(rm, 1, 1)));
  for (const char* role : {"actor", "critic"})
    EXPECT_NEAR(piped.parameter_sq_norm(role), plain.parameter_sq_norm(role), 1e-6 * plain.parameter_sq_norm(role))
        << role;
  for (int step = 1; step <= 2; ++step) {
    const nlohmann::json a = piped.step();
    const nlohmann::json b = plain.step();
    expect_follows(a, b, "at step " + std::to_string(step));
    // Generation is unstaged and unsplit (t_g = p_g = 1): every rank holds all M bytes while generating, what
    // it trained with among them, and received the rest.
    const double model_bytes = metric(a, "reshard/model_bytes");
    EXPECT_GT(model_bytes, 0);
    EXPECT_EQ(metric(a, "reshard/peak_extra_weight_bytes"), model_bytes);
    EXPECT_EQ(metric(a, "reshard/redundant_bytes"), 0);
    EXPECT_GT(metric(a, "reshard/to_generation_bytes_received"), model_bytes / 2);
    EXPECT_LT(metric(a, "reshard/to_generation_bytes_received"), model_bytes);
  }
  for (const char* role : {"actor", "critic"})
    EXPECT_NEAR(piped.parameter_sq_norm(role), plain.parameter_sq_norm(role), 1e-5 * plain.parameter_sq_norm(role))
        << role;
}

TEST(RlTrainerPipelineParallel, AStagedRunWithZeroResumesInAnyLayout) {
  TempDir dir;
  const std::string rm = write_reward_model(dir.path() + "/rm", /*layers=*/2);
  const std::string run = dir.path() + "/run";
  auto overrides = [&](int pp, bool sharded, std::vector<std::string> extra) {
    extra.push_back("trainer.run_dir=" + run);
    extra.push_back("reward_model.enable=false");
    if (sharded) {
      extra.push_back("actor_rollout_ref.actor.megatron.use_distributed_optimizer=true");
      extra.push_back("critic.megatron.use_distributed_optimizer=true");
    }
    return staged(rm, pp, 1, extra);
  };
  RLTrainer uninterrupted(load_rl_config("", staged(rm, 1, 1, {"reward_model.enable=false"})));
  const nlohmann::json plain_first = uninterrupted.step();
  const double plain_actor_norm = uninterrupted.parameter_sq_norm("actor");
  const nlohmann::json plain_second = uninterrupted.step();
  double actor_norm = 0, critic_norm = 0;
  std::string checkpoint;
  {
    // Two stages over two data-parallel groups, each stage's optimizer state partitioned over its group.
    RLTrainer first(load_rl_config("", overrides(2, true, {"trainer.total_steps=1", "trainer.save_freq=1"})));
    expect_follows(first.fit(), plain_first, "staged with ZeRO, step 1");
    actor_norm = first.parameter_sq_norm("actor");
    critic_norm = first.parameter_sq_norm("critic");
    checkpoint = first.last_checkpoint();
  }
  // The two stages' weights are one directory: an unstaged model loads it whole.
  EXPECT_NEAR(parameter_sq_norm(*load_pretrained(checkpoint + "/actor").model.ptr()), actor_norm, 1e-9 * actor_norm);
  EXPECT_NEAR(parameter_sq_norm(*load_pretrained(checkpoint + "/critic", HeadKind::kValue).model.ptr()), critic_norm,
              1e-9 * critic_norm);
  EXPECT_NEAR(actor_norm, plain_actor_norm, 1e-6 * plain_actor_norm);
  // So is the optimizer state: resumed staged with ZeRO or unstaged without it, step 2 is the uninterrupted one.
  for (const auto& [pp, sharded] : {std::pair<int, bool>{2, true}, std::pair<int, bool>{1, false}}) {
    const std::string what = "resumed with pp " + std::to_string(pp) + (sharded ? " and ZeRO" : "");
    RLTrainer resumed(load_rl_config("", overrides(pp, sharded, {"trainer.total_steps=2"})));
    EXPECT_EQ(resumed.steps_done(), 1) << what;
    EXPECT_NEAR(resumed.parameter_sq_norm("actor"), actor_norm, 1e-9 * actor_norm) << what;
    expect_follows(resumed.step(), plain_second, what + ", step 2");
    EXPECT_EQ(resumed.steps_done(), 2) << what;
  }
}

// The paper's baselines gather the whole model on every rank from the stages too: the run is the same, and
// the metrics show what they cost (M held, the training weights kept apart).
TEST(RlTrainerPipelineParallel, TheBaselineReshardModesRunWithStages) {
  TempDir dir;
  const std::string rm = write_reward_model(dir.path() + "/rm", /*layers=*/2);
  RLTrainer plain(load_rl_config("", staged(rm, 1, 1, {"reward_model.enable=false"})));
  const nlohmann::json want = plain.step();
  for (const char* mode : {"hybridflow-v", "allgather"}) {
    RLTrainer piped(load_rl_config(
        "", staged(rm, 2, 2, {"reward_model.enable=false", std::string("actor_rollout_ref.rollout.reshard_mode=") + mode})));
    const nlohmann::json got = piped.step();
    expect_follows(got, want, mode);
    const double model_bytes = metric(got, "reshard/model_bytes");
    EXPECT_EQ(metric(got, "reshard/peak_extra_weight_bytes"), model_bytes) << mode;
    EXPECT_GT(metric(got, "reshard/redundant_bytes"), model_bytes / 8) << mode;
  }
}

// Generation in two stages (rollout.pipeline_model_parallel_size = 2), two ways: the 2x1x2 actor generates
// in its own training stages, no switch; the 2x2x1 actor switches to (p_g 2, t_g 1) through the engine, each
// generation stage gathering only its own layers. Both have 2 replicas of unsplit stages, so they draw the
// same tokens, and their runs agree.
TEST(RlTrainerPipelineParallel, GenerationInStagesRunsWithAndWithoutASwitch) {
  TempDir dir;
  const std::string rm = write_reward_model(dir.path() + "/rm", /*layers=*/2);
  const std::vector<std::string> in_stages = {"reward_model.enable=false",
                                              "actor_rollout_ref.rollout.pipeline_model_parallel_size=2"};
  RLTrainer as_trained(load_rl_config("", staged(rm, 2, 1, in_stages)));
  RLTrainer switched(load_rl_config("", staged(rm, 2, 2, in_stages)));
  for (int step = 1; step <= 2; ++step) {
    const nlohmann::json want = as_trained.step();
    const nlohmann::json got = switched.step();
    expect_follows(got, want, "step " + std::to_string(step));
    EXPECT_FALSE(want.contains("reshard/model_bytes")) << "generating in the training layout needs no switch";
    const double model_bytes = metric(got, "reshard/model_bytes");
    // Rank 0 holds generation stage 0: the embedding and the first layer, unsplit, about half of M.
    EXPECT_GT(metric(got, "reshard/peak_extra_weight_bytes"), model_bytes / 4);
    EXPECT_LT(metric(got, "reshard/peak_extra_weight_bytes"), model_bytes * 3 / 4);
    EXPECT_EQ(metric(got, "reshard/redundant_bytes"), 0);
  }
}

TEST(RlTrainerPipelineParallel, StagesThatDoNotFitAreRefusedNamingTheKey) {
  auto error_for = [](std::vector<std::string> extra) {
    return error_of([&] { RLTrainer trainer(load_rl_config("", tiny_rl_overrides("grpo", extra))); });
  };
  std::string e = error_for({"actor_rollout_ref.num_processes=2", "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2",
                 "actor_rollout_ref.rollout.reshard_mode=all-gather"});
  EXPECT_NE(e.find("actor_rollout_ref.rollout.reshard_mode"), std::string::npos) << e;
  e = error_for({"actor_rollout_ref.num_processes=2", "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2",
                 "actor_rollout_ref.rollout.pipeline_model_parallel_size=3"});
  EXPECT_NE(e.find("actor_rollout_ref.rollout.pipeline_model_parallel_size = 3 must divide"), std::string::npos) << e;
  e = error_for({"actor_rollout_ref.num_processes=2", "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2",
                 "actor_rollout_ref.ref.megatron.pipeline_model_parallel_size=1"});
  EXPECT_NE(e.find("actor_rollout_ref.ref.megatron.pipeline_model_parallel_size = 1"), std::string::npos) << e;
  // One layer does not split into two stages: the worker's error names the model's key.
  e = error_for({"actor_rollout_ref.num_processes=2", "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2"});
  EXPECT_NE(e.find("num_hidden_layers"), std::string::npos) << e;
}
