// Router replay (actor_rollout_ref.actor.router_replay.mode) in GRPO steps over real worker processes on a
// tiny Qwen3-MoE actor: R3 replays the rollout's routing, R2 the old-log-prob pass's, and where the replayed
// routing is the routing the update would choose anyway, a step is the same, bit for bit, as without replay.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "hybridflow/core/error.h"
#include "hybridflow/runtime/worker_main.h"
#include "hybridflow/trainer/rl_trainer.h"
#include "hybridflow/workers/rl_workers.h"
#include "support/error_of.h"
#include "support/tiny_rl_config.h"

using namespace hybridflow;

static const bool kRanAsWorker = (register_rl_workers(), run_worker_if_requested());

using hybridflow::testing::error_of;
using hybridflow::testing::tiny_rl_overrides;
using ::testing::HasSubstr;

namespace {

// Four layers of the qwen3-moe-tiny preset (decoder_sparse_step 2: the second and fourth are MoE layers), one
// optimizer step per update (the mini-batch is the whole batch).
std::vector<std::string> moe_grpo(const std::string& mode, std::vector<std::string> extra = {}) {
  std::vector<std::string> o = {"model.preset=qwen3-moe-tiny", "model.num_hidden_layers=4",
                                "actor_rollout_ref.actor.router_replay.mode=" + mode, "trainer.total_steps=1"};
  o.insert(o.end(), extra.begin(), extra.end());
  return tiny_rl_overrides("grpo", o);
}

struct StepResult {
  nlohmann::json record;
  double before = 0, after = 0;
};
StepResult one_step(const std::vector<std::string>& overrides) {
  RLTrainer trainer(load_rl_config("", overrides));
  StepResult r;
  r.before = trainer.parameter_sq_norm("actor");
  r.record = trainer.step();
  r.after = trainer.parameter_sq_norm("actor");
  return r;
}

}  // namespace

TEST(RlRouterReplay, R3ReplaysTheRolloutsRoutingAndLogsHowOftenTrainingWouldRouteOtherwise) {
  const StepResult r3 = one_step(moe_grpo("R3"));
  EXPECT_NE(r3.after, r3.before);
  for (const char* key : {"actor/router_replay_rollout_routing_differs", "actor/router_replay_differs",
                          "actor/moe_expert_load_max_over_mean", "actor/moe_expert_load_max_over_mean_worst_layer"})
    ASSERT_TRUE(r3.record.contains(key)) << key << " missing in " << r3.record.dump();
  const double differs = r3.record.at("actor/router_replay_rollout_routing_differs").get<double>();
  EXPECT_GE(differs, 0.0);
  EXPECT_LE(differs, 1.0);
  const double load = r3.record.at("actor/moe_expert_load_max_over_mean").get<double>();
  EXPECT_GE(load, 1.0);
  EXPECT_LE(load, 8.0);  // 8 experts: at most every token on one
  EXPECT_GE(r3.record.at("actor/moe_expert_load_max_over_mean_worst_layer").get<double>(), load);

  // The same weights route the rollout's decode steps and the training forwards alike here (fp32, one
  // process): with one optimizer step per update, replay then changes nothing, bit for bit.
  const StepResult off = one_step(moe_grpo("disabled"));
  EXPECT_FALSE(off.record.contains("actor/router_replay_differs")) << off.record.dump();
  EXPECT_FALSE(off.record.contains("actor/moe_expert_load_max_over_mean")) << off.record.dump();
  EXPECT_EQ(off.before, r3.before);
  std::printf("R3: rollout routing differs for %.4f of the tokens; expert load max/mean %.3f\n", differs, load);
  ASSERT_EQ(differs, 0.0) << "the rollout's routing differs from training's: the bit-for-bit comparison needs none";
  EXPECT_EQ(r3.record.at("actor/router_replay_differs").get<double>(), 0.0);
  EXPECT_EQ(off.after, r3.after);
  EXPECT_EQ(off.record.at("actor/pg_loss").get<double>(), r3.record.at("actor/pg_loss").get<double>());
}

TEST(RlRouterReplay, R2ReplaysTheOldLogProbPasssRouting) {
  const StepResult r2 = one_step(moe_grpo("R2"));
  EXPECT_NE(r2.after, r2.before);
  EXPECT_TRUE(r2.record.contains("actor/router_replay_differs")) << r2.record.dump();
  EXPECT_TRUE(r2.record.contains("actor/moe_expert_load_max_over_mean")) << r2.record.dump();
  EXPECT_FALSE(r2.record.contains("actor/router_replay_rollout_routing_differs")) << r2.record.dump();
  // One optimizer step: the update's forward routes as the old-log-prob pass did.
  EXPECT_EQ(r2.record.at("actor/router_replay_differs").get<double>(), 0.0);
  const StepResult off = one_step(moe_grpo("disabled"));
  EXPECT_EQ(off.after, r2.after);
}

// Two pipeline stages (one MoE layer each): each stage records (R2) or replays its own layers, the old-log-prob
// pass combines the stages' routing, and with one optimizer step per update the run is the one without replay,
// bit for bit. R3's rollout generates unstaged (through the 3D-HybridEngine) and records every layer.
TEST(RlRouterReplay, R2AndR3InTwoPipelineStagesTrainAsWithoutReplay) {
  const std::vector<std::string> staged = {"actor_rollout_ref.num_processes=2",
                                           "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2"};
  const StepResult off = one_step(moe_grpo("disabled", staged));
  for (const std::string mode : {"R2", "R3"}) {
    const StepResult r = one_step(moe_grpo(mode, staged));
    EXPECT_EQ(off.before, r.before) << mode;
    EXPECT_NE(r.after, r.before) << mode;
    for (const char* key : {"actor/moe_expert_load_max_over_mean", "actor/moe_expert_load_max_over_mean_worst_layer"})
      ASSERT_TRUE(r.record.contains(key)) << mode << ": " << key << " missing in " << r.record.dump();
    // The update's own differs covers the last stage's layers only: not reported in stages.
    EXPECT_FALSE(r.record.contains("actor/router_replay_differs")) << mode;
    if (mode == "R3") {
      ASSERT_TRUE(r.record.contains("actor/router_replay_rollout_routing_differs")) << r.record.dump();
      ASSERT_EQ(r.record.at("actor/router_replay_rollout_routing_differs").get<double>(), 0.0);
    }
    EXPECT_EQ(off.after, r.after) << mode;
    EXPECT_EQ(off.record.at("actor/pg_loss").get<double>(), r.record.at("actor/pg_loss").get<double>()) << mode;
  }
}

// Two optimizer steps per update: the second replays routing its moved routers may no longer choose.
TEST(RlRouterReplay, R3TrainsOverSeveralMiniBatchesAndTokenMicroBatches) {
  const StepResult r = one_step(moe_grpo(
      "R3", {"actor_rollout_ref.actor.ppo_mini_batch_size=1", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
             "actor_rollout_ref.actor.optim.lr=5e-2", "actor_rollout_ref.actor.use_dynamic_bsz=true",
             "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=64"}));
  EXPECT_NE(r.after, r.before);
  const double differs = r.record.at("actor/router_replay_differs").get<double>();
  std::printf("R3 over two mini-batches: the update's routers differ from the replay for %.4f of the tokens\n",
              differs);
  EXPECT_GE(differs, 0.0);
  EXPECT_LE(differs, 1.0);
}

TEST(RlRouterReplay, BadModesAndLayoutsAreRefusedNamingTheKey) {
  EXPECT_THAT(error_of([] { RLTrainer t(load_rl_config("", moe_grpo("R4"))); }),
              HasSubstr("actor_rollout_ref.actor.router_replay.mode: expected disabled | R2 | R3"));
  EXPECT_THAT(error_of([] {
                RLTrainer t(load_rl_config(
                    "", moe_grpo("R3", {"actor_rollout_ref.num_processes=2",
                                        "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2",
                                        "actor_rollout_ref.rollout.pipeline_model_parallel_size=2"})));
              }),
              HasSubstr("actor_rollout_ref.actor.router_replay.mode = R3 records the rollout's routing, which "
                        "generation in pipeline stages does not do yet"));
  // Expert parallelism needs as many processes as its size (tests/trainer/test_rl_expert_parallel.cpp runs it).
  EXPECT_THAT(error_of([] {
                RLTrainer t(load_rl_config(
                    "", moe_grpo("R3", {"actor_rollout_ref.actor.megatron.expert_model_parallel_size=2"})));
              }),
              HasSubstr("actor_rollout_ref.actor.megatron.expert_model_parallel_size = 2 does not divide the role's 1 "
                        "data-parallel processes"));
  EXPECT_NO_THROW(load_rl_config("", moe_grpo("R3", {"actor_rollout_ref.actor.megatron.expert_model_parallel_size=1",
                                                    "actor_rollout_ref.rollout.enable_rollout_routing_replay=true"})));
}
