// The RL trainer with tensor-parallel roles on 4 processes: PPO whose actor (with its reference), critic
// and reward model are each split over 2 ranks and whose actor generates unsplit through the
// 3D-HybridEngine follows the all-data-parallel run of the same seed step for step; the engine's switches
// are logged as reshard/* with the paper's volume; a checkpoint of a split run with the ZeRO optimizer
// resumes in any layout; and layouts that do not fit are refused before any process starts, naming the key.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "hybridflow/model/pretrained.h"
#include "hybridflow/runtime/worker_main.h"
#include "hybridflow/tasks/task.h"
#include "hybridflow/trainer/rl_trainer.h"
#include "hybridflow/workers/model_spec.h"
#include "hybridflow/workers/rl_workers.h"
#include "support/error_of.h"
#include "support/temp_dir.h"
#include "support/tiny_rl_config.h"
#include "trainer/parallel_ppo_fixture.h"

using namespace hybridflow;
using hybridflow::testing::error_of;
using namespace hybridflow::testing;

static const bool kRanAsWorker = (register_rl_workers(), run_worker_if_requested());


TEST(RlTrainerTensorParallel, PpoSplitTwoWaysFollowsTheDataParallelRun) {
  hybridflow::testing::TempDir dir;
  const std::string rm = write_reward_model(dir.path() + "/rm");
  RLTrainer split(load_rl_config("", ppo_on_four(rm, 2, 1)));
  RLTrainer plain(load_rl_config("", ppo_on_four(rm, 1, 1)));
  // The same initial weights, whatever the split.
  for (const char* role : {"actor", "critic"})
    EXPECT_NEAR(split.parameter_sq_norm(role), plain.parameter_sq_norm(role), 1e-6 * plain.parameter_sq_norm(role))
        << role;
  for (int step = 1; step <= 2; ++step) {
    const nlohmann::json a = split.step();
    const nlohmann::json b = plain.step();
    // Generation with the gathered weights draws the same tokens, so rewards and scores agree exactly.
    expect_follows(a, b, "at step " + std::to_string(step));
    // t = 2 -> t_g = 1 gathers the other half of every split weight: (t - t_g) / (t_g * t) * M = M / 2
    // (Table 2), holds the whole model for generation and no second copy of anything.
    const double model_bytes = metric(a, "reshard/model_bytes");
    EXPECT_GT(model_bytes, 0);
    EXPECT_EQ(metric(a, "reshard/to_generation_bytes_received"), model_bytes / 2);
    EXPECT_EQ(metric(a, "reshard/to_generation_bytes_sent"), model_bytes / 2);
    EXPECT_EQ(metric(a, "reshard/peak_extra_weight_bytes"), model_bytes);
    EXPECT_EQ(metric(a, "reshard/redundant_bytes"), 0);
    EXPECT_EQ(metric(a, "reshard/to_training_bytes_received"), 0);
    EXPECT_FALSE(b.contains("reshard/model_bytes")) << "no engine without a layout change";
  }
  for (const char* role : {"actor", "critic"})
    EXPECT_NEAR(split.parameter_sq_norm(role), plain.parameter_sq_norm(role), 1e-5 * plain.parameter_sq_norm(role))
        << role;
}

// A checkpoint is layout-free: weights in one Hugging Face directory, the optimizer state by parameter name
// in one file. A run split two ways with the ZeRO optimizer saves after step 1; resumed in its own layout
// and in another (unsplit, no ZeRO), step 2 is the step the uninterrupted unsplit run takes.
TEST(RlTrainerTensorParallel, ACheckpointResumesInAnyLayout) {
  hybridflow::testing::TempDir dir;
  const std::string rm = write_reward_model(dir.path() + "/rm");
  const std::string run = dir.path() + "/run";
  const std::vector<std::string> zero = {"actor_rollout_ref.actor.megatron.use_distributed_optimizer=true",
                                         "critic.megatron.use_distributed_optimizer=true"};
  auto overrides = [&](int tp, bool sharded, std::vector<std::string> extra) {
    extra.push_back("trainer.run_dir=" + run);
    extra.push_back("reward_model.enable=false");
    if (sharded) extra.insert(extra.end(), zero.begin(), zero.end());
    // Generating unsplit draws the same tokens as the unsplit run.
    return ppo_on_four(rm, tp, 1, extra);
  };
  RLTrainer uninterrupted(load_rl_config("", ppo_on_four(rm, 1, 1, {"reward_model.enable=false"})));
  const nlohmann::json plain_first = uninterrupted.step();
  const nlohmann::json plain_second = uninterrupted.step();

  {
    RLTrainer first(load_rl_config("", overrides(2, true, {"trainer.total_steps=1"})));
    const nlohmann::json step = first.step();
    expect_follows(step, plain_first, "split with ZeRO, step 1");
    // Each rank keeps Adam's moments and an fp32 master of 1/(t d) of the model, against two moments of the
    // whole model unsplit.
    const double ratio = metric(step, "actor/optimizer_state_bytes") / metric(plain_first, "actor/optimizer_state_bytes");
    EXPECT_GT(ratio, 3.0 / 8 - 0.01);
    EXPECT_LT(ratio, 3.0 / 8 + 0.05);
    first.save_checkpoint();
  }
  for (const auto& [tp, sharded] : {std::pair<int, bool>{2, true}, std::pair<int, bool>{1, false}}) {
    const std::string what = "resumed with tp " + std::to_string(tp) + (sharded ? " and ZeRO" : "");
    RLTrainer resumed(load_rl_config("", overrides(tp, sharded, {"trainer.total_steps=2"})));
    EXPECT_EQ(resumed.steps_done(), 1) << what;
    expect_follows(resumed.step(), plain_second, what + ", step 2");
    for (const char* role : {"actor", "critic"})
      EXPECT_NEAR(resumed.parameter_sq_norm(role), uninterrupted.parameter_sq_norm(role),
                  1e-5 * uninterrupted.parameter_sq_norm(role))
          << role << " " << what;
  }
}

TEST(RlTrainerTensorParallel, LayoutsThatDoNotFitAreRefusedNamingTheKey) {
  auto error_for = [](std::vector<std::string> extra) {
    return error_of([&] { RLTrainer trainer(load_rl_config("", hybridflow::testing::tiny_rl_overrides("grpo", extra))); });
  };
  std::string e = error_for({"actor_rollout_ref.num_processes=3", "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2"});
  EXPECT_NE(e.find("actor_rollout_ref.num_processes = 3 processes do not divide"), std::string::npos) << e;
  EXPECT_NE(e.find("actor_rollout_ref.actor.megatron.tensor_model_parallel_size = 2"), std::string::npos) << e;
  e = error_for({"actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2"});
  EXPECT_NE(e.find("actor_rollout_ref.actor.megatron.pipeline_model_parallel_size = 2"), std::string::npos) << e;
  e = error_for({"actor_rollout_ref.num_processes=2", "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
                 "actor_rollout_ref.rollout.tensor_model_parallel_size=3"});
  EXPECT_NE(e.find("actor_rollout_ref.rollout.tensor_model_parallel_size = 3 must divide"), std::string::npos) << e;
  {
    // verl's FSDP actor with vLLM at TP 2: a multiple of the training size generates at the training size.
    RLTrainer verl_layout(load_rl_config("", hybridflow::testing::tiny_rl_overrides(
                                                 "grpo", {"actor_rollout_ref.num_processes=2", "trainer.total_steps=1",
                                                          "actor_rollout_ref.rollout.tensor_model_parallel_size=2"})));
    EXPECT_TRUE(verl_layout.step().contains("actor/pg_loss"));
  }
  e = error_for({"actor_rollout_ref.num_processes=2", "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
                 "actor_rollout_ref.ref.megatron.tensor_model_parallel_size=1"});
  EXPECT_NE(e.find("actor_rollout_ref.ref.megatron.tensor_model_parallel_size = 1"), std::string::npos) << e;
  e = error_for({"actor_rollout_ref.num_processes=2", "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
                 "actor_rollout_ref.rollout.tensor_model_parallel_size=1", "actor_rollout_ref.rollout.reshard_mode=gather"});
  EXPECT_NE(e.find("actor_rollout_ref.rollout.reshard_mode"), std::string::npos) << e;
  // 2 prompts cannot split over the 4 generation replicas of tp 2 -> 1 on 4 processes.
  e = error_for({"actor_rollout_ref.num_processes=4", "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
                 "actor_rollout_ref.rollout.tensor_model_parallel_size=1"});
  EXPECT_NE(e.find("4 generation replicas"), std::string::npos) << e;
  e = error_for({"algorithm.adv_estimator=gae", "critic.num_processes=2", "trainer.placement=split",
                 "critic.megatron.tensor_model_parallel_size=4"});
  EXPECT_NE(e.find("critic.num_processes = 2 processes do not divide"), std::string::npos) << e;
}
