// PPO (GAE, with a critic) on a tiny Qwen3-MoE actor and critic whose experts split over expert parallelism 2 and
// 4, alone and inside tensor parallelism 2 (2 to 8 processes), follows one process step for step within 1e-5:
// scores, response lengths, policy and value losses, entropy, values, both gradient norms and the trained
// weights. Generation keeps the single most likely token (top_k 1), so every layout draws the same responses.
// With the ZeRO optimizer (use_distributed_optimizer) the experts' optimizer state partitions over the ranks
// owning the same experts: at expert parallelism 2 on 2 processes (one owner each), on 4 (two owners) and on 4
// with tensor parallelism 2 the run follows one process too; a checkpoint saved after step 1 resumes bit for bit
// in its own layout and follows in one process.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "hybridflow/runtime/worker_main.h"
#include "hybridflow/trainer/rl_trainer.h"
#include "hybridflow/workers/rl_workers.h"
#include "support/deterministic_metrics.h"
#include "support/temp_dir.h"
#include "support/tiny_rl_config.h"

using namespace hybridflow;

static const bool kRanAsWorker = (register_rl_workers(), run_worker_if_requested());

namespace {

constexpr int kSteps = 2;
constexpr double kTol = 1e-5;

struct MoeLayout {
  int processes = 1, ep = 1, tp = 1;
  bool zero = false;
  std::string name() const {
    return std::to_string(processes) + " processes, ep " + std::to_string(ep) + ", tp " + std::to_string(tp) +
           (zero ? ", ZeRO" : "");
  }
};

// PPO on the qwen3-moe-tiny preset's 2 layers (the second routes over 8 experts), actor and critic in the same
// layout: 4 prompts x 2 samples, one mini-batch a step, one sample per micro-batch, in order.
std::vector<std::string> moe_ppo(const MoeLayout& l, const std::string& run_dir,
                                 const std::vector<std::string>& more = {}) {
  const std::string p = std::to_string(l.processes), ep = std::to_string(l.ep), tp = std::to_string(l.tp);
  const std::string zero = l.zero ? "true" : "false";
  std::vector<std::string> o = {"model.preset=qwen3-moe-tiny",
                                "model.num_hidden_layers=2",
                                "trainer.placement=colocate",
                                "data.train_batch_size=4",
                                "actor_rollout_ref.rollout.top_k=1",
                                "actor_rollout_ref.num_processes=" + p,
                                "critic.num_processes=" + p,
                                "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
                                "actor_rollout_ref.actor.shuffle=false",
                                "critic.ppo_mini_batch_size=4",
                                "critic.ppo_micro_batch_size_per_gpu=1",
                                "critic.shuffle=false",
                                "actor_rollout_ref.actor.megatron.expert_model_parallel_size=" + ep,
                                "critic.megatron.expert_model_parallel_size=" + ep,
                                "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=" + tp,
                                "critic.megatron.tensor_model_parallel_size=" + tp,
                                "actor_rollout_ref.actor.megatron.use_distributed_optimizer=" + zero,
                                "critic.megatron.use_distributed_optimizer=" + zero};
  hybridflow::testing::append_digit_reward_run(o, kSteps, run_dir, more);
  return hybridflow::testing::tiny_rl_overrides("gae", o);
}

struct PpoRun {
  std::vector<nlohmann::json> steps;
  double actor_norm = 0, critic_norm = 0;
};

PpoRun train(const MoeLayout& layout) {
  hybridflow::testing::TempDir dir;
  RLTrainer trainer(load_rl_config("", moe_ppo(layout, dir.path())));
  PpoRun run;
  for (int step = 1; step <= kSteps; ++step) run.steps.push_back(trainer.step());
  run.actor_norm = trainer.parameter_sq_norm("actor");
  run.critic_norm = trainer.parameter_sq_norm("critic");
  return run;
}

const PpoRun& one_process() {
  static const PpoRun run = train({});
  return run;
}

void expect_same_step(const nlohmann::json& got, const nlohmann::json& want, const std::string& at) {
  for (const std::string key : {"score/mean", "response_length/mean", "values/mean", "actor/pg_loss",
                                "actor/entropy", "actor/grad_norm", "critic/vf_loss", "critic/vpred_mean",
                                "critic/grad_norm"}) {
    ASSERT_TRUE(got.contains(key)) << key << " " << at;
    ASSERT_TRUE(want.contains(key)) << key << " " << at;
    const double w = want.at(key).get<double>();
    EXPECT_NEAR(got.at(key).get<double>(), w, kTol * (1 + std::abs(w))) << key << " " << at;
  }
}

void expect_follows_one_process(const MoeLayout& layout) {
  const PpoRun& want = one_process();
  const PpoRun got = train(layout);
  const std::string what = layout.name();
  ASSERT_EQ(got.steps.size(), want.steps.size());
  for (size_t i = 0; i < want.steps.size(); ++i)
    expect_same_step(got.steps[i], want.steps[i], what + " at step " + std::to_string(i + 1));
  EXPECT_NEAR(got.actor_norm, want.actor_norm, kTol * want.actor_norm) << what;
  EXPECT_NEAR(got.critic_norm, want.critic_norm, kTol * want.critic_norm) << what;
  EXPECT_GT(want.steps.back().at("critic/vf_loss").get<double>(), 0.0);
  // Experts folded over exactly the tensor-parallel ranks sum their parts instead of exchanging tokens.
  const bool exchanges = layout.ep != layout.tp;
  for (const std::string role : {"actor", "critic"}) {
    const std::string key = role + "/expert_parallel_all_to_all_mb";
    ASSERT_TRUE(got.steps.back().contains(key)) << key << " " << what;
    EXPECT_EQ(got.steps.back().at(key).get<double>() > 0.0, exchanges) << key << " " << what;
    EXPECT_FALSE(want.steps.back().contains(key)) << key;
  }
}

}  // namespace

TEST(RlExpertParallelPpo, ExpertsSplitTwoAndFourWaysFollowOneProcess) {
  expect_follows_one_process({.processes = 2, .ep = 2});
  expect_follows_one_process({.processes = 4, .ep = 4});
}

TEST(RlExpertParallelPpo, ExpertsSplitInsideTensorParallelismFollowOneProcess) {
  expect_follows_one_process({.processes = 4, .ep = 2, .tp = 2});
  expect_follows_one_process({.processes = 8, .ep = 4, .tp = 2});
}

TEST(RlExpertParallelPpo, WithTheDistributedOptimizerFollowsOneProcess) {
  expect_follows_one_process({.processes = 2, .ep = 2, .zero = true});
  // Two owners of each expert: the experts' moments and masters are partitioned as well.
  expect_follows_one_process({.processes = 4, .ep = 2, .zero = true});
  // And inside tensor parallelism 2 (each tensor-parallel rank's data-parallel group partitions alike).
  expect_follows_one_process({.processes = 4, .ep = 2, .tp = 2, .zero = true});
}

// Saved after step 1 at expert parallelism 2 with ZeRO on 4 processes (each expert's state split over its two
// owners, gathered into the layout-free file), step 2 resumed in the same layout is the uninterrupted step bit for
// bit; resumed in one process it follows within 1e-5.
TEST(RlExpertParallelPpo, ACheckpointWithTheDistributedOptimizerResumes) {
  const MoeLayout layout{.processes = 4, .ep = 2, .zero = true};
  hybridflow::testing::TempDir straight_dir, dir;
  nlohmann::json second;
  double actor_norm = 0, critic_norm = 0;
  {
    RLTrainer straight(load_rl_config("", moe_ppo(layout, straight_dir.path())));
    straight.step();
    second = straight.step();
    actor_norm = straight.parameter_sq_norm("actor");
    critic_norm = straight.parameter_sq_norm("critic");
  }
  {
    RLTrainer first(load_rl_config("", moe_ppo(layout, dir.path(), {"trainer.total_steps=1"})));
    first.step();
    first.save_checkpoint();
  }
  {
    RLTrainer resumed(load_rl_config("", moe_ppo(layout, dir.path())));
    ASSERT_EQ(resumed.steps_done(), 1);
    const nlohmann::json got = resumed.step();
    EXPECT_EQ(hybridflow::testing::deterministic_metrics(got), hybridflow::testing::deterministic_metrics(second));
    EXPECT_EQ(resumed.parameter_sq_norm("actor"), actor_norm);
    EXPECT_EQ(resumed.parameter_sq_norm("critic"), critic_norm);
  }
  RLTrainer single(load_rl_config("", moe_ppo({}, dir.path())));
  ASSERT_EQ(single.steps_done(), 1);
  expect_same_step(single.step(), second, "resumed in one process, step 2");
  EXPECT_NEAR(single.parameter_sq_norm("actor"), actor_norm, kTol * actor_norm);
  EXPECT_NEAR(single.parameter_sq_norm("critic"), critic_norm, kTol * critic_norm);
}
