// LoRA adapters split over tensor-parallel ranks in the RL trainer: GRPO whose actor (and reference, the actor
// with its adapters off) is split two and four ways, two ways over two pipeline stages, and PPO whose critic trains
// adapters too follow the one-process run of the same seed within 1e-5 (scores, losses, entropy, KL,
// gradient norms) and save the same whole adapters in PEFT's format. Each generates split on merged weights
// as one replica, as one process does (sampling draws per generation replica).
#include <gtest/gtest.h>

#include <cmath>

#include "hybridflow/core/fs.h"
#include "hybridflow/model/lora.h"
#include "hybridflow/runtime/worker_main.h"
#include "hybridflow/trainer/rl_trainer.h"
#include "hybridflow/workers/rl_workers.h"
#include "support/temp_dir.h"
#include "support/tiny_rl_config.h"

using namespace hybridflow;

static const bool kRanAsWorker = (register_rl_workers(), run_worker_if_requested());

namespace {

constexpr int kLoraTpSteps = 2;
// Two AdamW steps on sums split over ranks: their order, and the CPU's GEMM kernels, move the adapters by up to
// 3.1e-5 on an AVX-only AMD EPYC (under 1e-5 on an AVX-512 Xeon).
constexpr double kTol = 1e-4;

struct SplitLoraRun {
  std::vector<nlohmann::json> steps;
  double actor_norm = 0;
  std::map<std::string, torch::Tensor> adapter;
  std::map<std::string, torch::Tensor> critic_adapter;  // with a LoRA critic
};

// `processes` actor processes split tp ways (and pp stages) on a `layers`-layer model; with `critic`, PPO
// whose critic (on the same processes, split alike) trains adapters too.
SplitLoraRun train_split(int processes, int tp, int pp, int layers, bool critic = false,
                         const std::vector<std::string>& more = {}) {
  hybridflow::testing::TempDir dir;
  std::vector<std::string> extra = {
      "reward.type=command",
      "reward.shell=/usr/bin/python3 -c \"import sys,json; [print(sum(c.isdigit() for c in "
      "json.loads(l)['response']) / 4.0, flush=True) for l in sys.stdin]\"",
      "model.num_hidden_layers=" + std::to_string(layers),
      "actor_rollout_ref.model.lora_rank=4",
      "actor_rollout_ref.model.lora_alpha=8",
      "actor_rollout_ref.actor.use_kl_loss=true",
      "actor_rollout_ref.actor.optim.lr=2e-2",
      "actor_rollout_ref.actor.shuffle=false",
      "actor_rollout_ref.num_processes=" + std::to_string(processes),
      "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=" + std::to_string(tp),
      "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=" + std::to_string(pp),
      "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
      "trainer.total_steps=" + std::to_string(kLoraTpSteps),
      "trainer.log_samples_freq=0",
      "trainer.run_dir=" + dir.path()};
  if (critic)
    extra.insert(extra.end(), {"critic.model.lora_rank=4", "critic.model.lora_alpha=8", "critic.optim.lr=2e-2",
                               "critic.shuffle=false", "critic.megatron.tensor_model_parallel_size=" + std::to_string(tp),
                               "critic.ppo_micro_batch_size_per_gpu=2"});
  extra.insert(extra.end(), more.begin(), more.end());
  RLTrainer trainer(load_rl_config("", hybridflow::testing::tiny_rl_overrides(critic ? "gae" : "grpo", extra)));
  SplitLoraRun run;
  for (int step = 1; step <= kLoraTpSteps; ++step) run.steps.push_back(trainer.step());
  run.actor_norm = trainer.parameter_sq_norm("actor");
  trainer.fit();  // no steps left: writes <run_dir>/lora_adapter/actor
  run.adapter = read_lora_adapter_tensors(dir.path() + "/lora_adapter/actor");
  if (critic) run.critic_adapter = read_lora_adapter_tensors(dir.path() + "/lora_adapter/critic");
  return run;
}

void expect_same_tensors(const std::map<std::string, torch::Tensor>& got,
                         const std::map<std::string, torch::Tensor>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (const auto& [name, tensor] : want) {
    ASSERT_TRUE(got.count(name)) << name << " " << what;
    const torch::Tensor& g = got.at(name);
    ASSERT_EQ(g.sizes(), tensor.sizes()) << name << " " << what;
    EXPECT_LE((g - tensor).abs().max().item<double>(), kTol) << name << " " << what;
  }
}

void expect_same_run(const SplitLoraRun& got, const SplitLoraRun& want, const std::string& what) {
  ASSERT_EQ(got.steps.size(), want.steps.size());
  std::vector<std::string> keys = {"score/mean",    "response_length/mean", "actor/pg_loss", "actor/kl_loss",
                                   "actor/entropy", "actor/ppo_kl",         "actor/grad_norm"};
  if (!want.critic_adapter.empty()) keys.insert(keys.end(), {"critic/vpred_mean", "critic/vf_loss", "critic/grad_norm"});
  for (size_t i = 0; i < want.steps.size(); ++i) {
    const std::string at = what + " at step " + std::to_string(i + 1);
    for (const std::string& key : keys) {
      ASSERT_TRUE(got.steps[i].contains(key)) << key << " " << at;
      const double w = want.steps[i].at(key).get<double>();
      EXPECT_NEAR(got.steps[i].at(key).get<double>(), w, kTol * (1 + std::abs(w))) << key << " " << at;
    }
  }
  EXPECT_GT(want.steps.back().at("actor/kl_loss").get<double>(), 0.0) << "the adapters moved";
  EXPECT_NEAR(got.actor_norm, want.actor_norm, kTol * want.actor_norm) << what;
  ASSERT_FALSE(want.adapter.empty());
  expect_same_tensors(got.adapter, want.adapter, what + ", the actor's saved adapter");
  expect_same_tensors(got.critic_adapter, want.critic_adapter, what + ", the critic's saved adapter");
}

}  // namespace

TEST(RlLoraTensorParallel, SplitTwoWaysFollowsTheOneProcessRun) {
  const SplitLoraRun one = train_split(1, 1, 1, 1);
  // Generating split too: one replica, as one process (sampling draws per replica).
  const SplitLoraRun split = train_split(2, 2, 1, 1, false, {"actor_rollout_ref.rollout.tensor_model_parallel_size=2"});
  expect_same_run(split, one, "tp 2");
}

TEST(RlLoraTensorParallel, SplitTwoWaysOverTwoStagesFollowsTheOneProcessRun) {
  const SplitLoraRun one = train_split(1, 1, 1, 2);
  const SplitLoraRun split = train_split(4, 2, 2, 2, false,
                                         {"actor_rollout_ref.rollout.tensor_model_parallel_size=2",
                                          "actor_rollout_ref.rollout.pipeline_model_parallel_size=2"});
  expect_same_run(split, one, "tp 2 x pp 2");
}

TEST(RlLoraTensorParallel, PpoWithALoraCriticSplitTwoWaysFollowsTheOneProcessRun) {
  const SplitLoraRun one = train_split(1, 1, 1, 1, /*critic=*/true);
  const SplitLoraRun split =
      train_split(2, 2, 1, 1, /*critic=*/true, {"actor_rollout_ref.rollout.tensor_model_parallel_size=2"});
  ASSERT_FALSE(one.critic_adapter.empty());
  expect_same_run(split, one, "ppo, tp 2");
}

TEST(RlLoraTensorParallel, SplitFourWaysFollowsTheOneProcessRun) {
  // 4 attention heads so that each of 4 ranks has one (the one KV head is replicated).
  const std::vector<std::string> heads = {"model.num_attention_heads=4"};
  std::vector<std::string> split_four = heads;
  split_four.push_back("actor_rollout_ref.rollout.tensor_model_parallel_size=4");
  const SplitLoraRun one = train_split(1, 1, 1, 1, false, heads);
  const SplitLoraRun split = train_split(4, 4, 1, 1, false, split_four);
  expect_same_run(split, one, "tp 4");
}
