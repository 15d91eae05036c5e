// A config written for verl (examples/verl_grpo.yaml: verl's GRPO example in verl's key layout) loads and
// trains: verl's names take effect under hybridflow's keys, and the keys only verl's Python stack reads
// come back in one warning. The docs' table of renamed keys is the code's alias table.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "hybridflow/core/jsonl.h"
#include "hybridflow/runtime/worker_main.h"
#include "hybridflow/trainer/rl_trainer.h"
#include "hybridflow/trainer/verl_keys.h"
#include "hybridflow/workers/rl_workers.h"
#include "support/error_of.h"
#include "support/temp_dir.h"

using namespace hybridflow;
using ::testing::HasSubstr;
using ::testing::Not;

static const bool kRanAsWorker = (register_rl_workers(), run_worker_if_requested());

namespace {

const std::string kExample = std::string(HF_SOURCE_DIR) + "/examples/verl_grpo.yaml";

// The example's own keys make a run of 2 prompts x 2 responses of 4 tokens; these shrink the tiny preset.
const std::vector<std::string> kTinyModel = {"model.hidden_size=32", "model.num_hidden_layers=1",
                                             "model.num_attention_heads=2", "model.num_key_value_heads=1",
                                             "model.intermediate_size=64"};

std::vector<std::string> with_tiny_model(std::vector<std::string> extra) {
  extra.insert(extra.begin(), kTinyModel.begin(), kTinyModel.end());
  return extra;
}

TEST(VerlConfig, GrpoExampleMapsVerlKeysAndTrainsTwoSteps) {
  hybridflow::testing::TempDir dir;
  ::testing::internal::CaptureStderr();
  const Config config = load_rl_config(kExample, with_tiny_model({"trainer.default_local_dir=" + dir.path()}));
  const std::string log = ::testing::internal::GetCapturedStderr();

  // Renamed and derived keys took effect.
  EXPECT_EQ(config.get<int64_t>("trainer.total_steps"), 2);  // total_training_steps wins over total_epochs
  EXPECT_EQ(config.get<int64_t>("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"), 2);
  EXPECT_EQ(config.get<int64_t>("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu"), 4);
  EXPECT_EQ(config.get<std::string>("trainer.run_dir"), dir.path());  // default_local_dir
  EXPECT_EQ(config.get<int64_t>("actor_rollout_ref.num_processes"), 1);  // n_gpus_per_node x nnodes
  EXPECT_EQ(config.get<std::string>("algorithm.adv_estimator"), "grpo");
  EXPECT_TRUE(config.get<bool>("actor_rollout_ref.actor.use_kl_loss"));

  // One warning, listing every key the file set that only verl's Python stack reads.
  EXPECT_EQ(log.find("ignoring"), log.rfind("ignoring")) << log;
  for (const char* key : {"actor_rollout_ref.rollout.name", "actor_rollout_ref.actor.strategy",
                          "actor_rollout_ref.ref.fsdp_config.param_offload"})
    EXPECT_THAT(log, HasSubstr("\n  " + std::string(key))) << key;
  // Keys read under hybridflow's name are not in it (the file's trainer.critic_warmup among them); nor are
  // the actor's offload keys, which hybridflow reads as verl does (the file sets them false), while the rest
  // of fsdp_config is still verl's alone; nor is verl's activation checkpointing or padding removal,
  // hybridflow's own keys too.
  EXPECT_THAT(log, Not(HasSubstr("ppo_micro_batch_size_per_gpu")));
  EXPECT_THAT(log, Not(HasSubstr("critic_warmup")));
  EXPECT_THAT(log, Not(HasSubstr("gpu_memory_utilization")));  // the paged KV cache's pool on a GPU
  EXPECT_THAT(log, Not(HasSubstr("actor_rollout_ref.actor.fsdp_config.param_offload")));
  EXPECT_FALSE(config.get<bool>("actor_rollout_ref.actor.fsdp_config.optimizer_offload"));
  EXPECT_THAT(log, Not(HasSubstr("enable_gradient_checkpointing")));
  EXPECT_TRUE(config.get<bool>("actor_rollout_ref.model.enable_gradient_checkpointing"));
  // Padding-free packing is hybridflow's too (the example turns it on).
  EXPECT_THAT(log, Not(HasSubstr("use_remove_padding")));
  EXPECT_TRUE(config.get<bool>("actor_rollout_ref.model.use_remove_padding"));
  EXPECT_THAT(log, Not(HasSubstr("total_training_steps")));

  RLTrainer trainer(config);
  EXPECT_EQ(trainer.roles(), (std::vector<std::string>{"actor"}));  // GRPO: no critic
  const double before = trainer.parameter_sq_norm("actor");
  const nlohmann::json last = trainer.fit();
  EXPECT_EQ(trainer.steps_done(), 2);
  EXPECT_NE(trainer.parameter_sq_norm("actor"), before);
  EXPECT_TRUE(last.contains("actor/kl_loss") || last.contains("actor/ref_kl")) << last.dump();
  EXPECT_TRUE(last.contains("val/score")) << last.dump();  // test_freq: 2
  EXPECT_TRUE(std::filesystem::exists(dir.path() + "/checkpoints/step_2")) << "save_freq: 2";
  // trainer.logger [console, wandb]: wandb is skipped and no jsonl sink was asked for.
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/metrics.jsonl"));
}

TEST(VerlConfig, VerlCommandLineOverridesAndDerivedSettings) {
  // verl's examples pass these on the command line.
  const Config config = load_rl_config(
      kExample, {"actor_rollout_ref.model.path=/models/qwen", "data.train_files=[/data/train.parquet]",
                 "data.val_files=/data/test.parquet",
                 "actor_rollout_ref.actor.grad_clip=0.5", "trainer.n_gpus_per_node=2", "trainer.nnodes=2"});
  EXPECT_EQ(config.get<std::string>("model.path"), "/models/qwen");
  EXPECT_EQ(config.get<std::string>("data.train_file"), "/data/train.parquet");
  EXPECT_EQ(config.get<std::string>("data.test_file"), "/data/test.parquet");
  EXPECT_DOUBLE_EQ(config.get<double>("actor_rollout_ref.actor.optim.grad_clip"), 0.5);
  EXPECT_EQ(config.get<int64_t>("actor_rollout_ref.num_processes"), 4);
  EXPECT_EQ(config.get<int64_t>("critic.num_processes"), 4);
  // project_name / experiment_name name the run directory as verl's default_local_dir does.
  EXPECT_EQ(config.get<std::string>("trainer.run_dir"), "checkpoints/verl_grpo_example_addition/tiny_function_rm");
}

TEST(VerlConfig, TotalEpochsSetsTotalStepsUnlessStepsAreGiven) {
  // 15 epochs of 16 generated prompts in batches of 2: 8 steps an epoch.
  EXPECT_EQ(load_rl_config(kExample, {"trainer.total_training_steps=null"}).get<int64_t>("trainer.total_steps"), 120);
  EXPECT_EQ(load_rl_config(kExample, {"trainer.total_training_steps=null", "trainer.total_steps=5"})
                .get<int64_t>("trainer.total_steps"),
            5);
  EXPECT_EQ(load_rl_config("", {"trainer.total_epochs=1", "data.train_size=7", "data.train_batch_size=2"})
                .get<int64_t>("trainer.total_steps"),
            3);  // verl drops the last partial batch
}

TEST(VerlConfig, UnsupportedValuesAndUnknownKeysAreErrors) {
  using hybridflow::testing::error_of;
  EXPECT_THAT(error_of([] { load_rl_config(kExample, {"actor_rollout_ref.rollout.name=trtllm"}); }),
              HasSubstr("config key 'actor_rollout_ref.rollout.name' = 'trtllm'"));
  EXPECT_THAT(error_of([] { load_rl_config(kExample, {"actor_rollout_ref.rollout.skip_rollout=true"}); }),
              HasSubstr("'actor_rollout_ref.rollout.skip_rollout' = 'true'"));
  EXPECT_THAT(error_of([] { load_rl_config(kExample, {"actor_rollout_ref.actor.fsdp_confg.param_offload=true"}); }),
              HasSubstr("unknown config key 'actor_rollout_ref.actor.fsdp_confg'"));
}

// "| `verl.key` | `hybridflow.key` | renamed |" rows of docs/configuration.md.
std::set<std::pair<std::string, std::string>> documented_aliases() {
  std::ifstream in(std::string(HF_SOURCE_DIR) + "/docs/configuration.md");
  std::set<std::pair<std::string, std::string>> out;
  std::string line;
  while (std::getline(in, line)) {
    const std::string tail = " | renamed |";
    if (line.rfind("| `", 0) != 0 || line.size() < tail.size() ||
        line.compare(line.size() - tail.size(), tail.size(), tail) != 0)
      continue;
    const size_t a = 3, a_end = line.find('`', a);
    const size_t b = line.find('`', a_end + 1) + 1, b_end = line.find('`', b);
    out.emplace(line.substr(a, a_end - a), line.substr(b, b_end - b));
  }
  return out;
}

TEST(VerlConfig, DocsTableListsExactlyTheCodesAliases) {
  std::set<std::pair<std::string, std::string>> code;
  for (const auto& alias : verl_key_compat().aliases) code.insert(alias);
  EXPECT_EQ(documented_aliases(), code);
  EXPECT_GE(code.size(), 10u);
}

}  // namespace
