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
  EXPECT_EQ(rl_run_spec(config).data.train_files, std::vector<std::string>{"/data/train.parquet"});
  EXPECT_EQ(rl_run_spec(config).data.test_files, std::vector<std::string>{"/data/test.parquet"});
  EXPECT_DOUBLE_EQ(config.get<double>("actor_rollout_ref.actor.optim.grad_clip"), 0.5);
  EXPECT_EQ(config.get<int64_t>("actor_rollout_ref.num_processes"), 4);
  EXPECT_EQ(config.get<int64_t>("critic.num_processes"), 4);
  // project_name / experiment_name name the run directory as verl's default_local_dir does.
  EXPECT_EQ(config.get<std::string>("trainer.run_dir"), "checkpoints/verl_grpo_example_addition/tiny_function_rm");
}

// verl's examples list several files (data.train_files=[gsm8k/train.parquet,math/train.parquet]); hybridflow's own
// key takes one file or a list the same way.
TEST(VerlConfig, DataFilesTakeOneFileOrAList) {
  const auto files = [](const std::vector<std::string>& overrides) { return rl_run_spec(load_rl_config("", overrides)).data; };
  EXPECT_EQ(files({"data.train_files=[/d/gsm8k.parquet,/d/math.parquet]"}).train_files,
            (std::vector<std::string>{"/d/gsm8k.parquet", "/d/math.parquet"}));
  EXPECT_EQ(files({"data.val_files=[/d/a.jsonl,/d/b.jsonl]"}).test_files,
            (std::vector<std::string>{"/d/a.jsonl", "/d/b.jsonl"}));
  EXPECT_EQ(files({"data.train_file=/d/one.jsonl"}).train_files, std::vector<std::string>{"/d/one.jsonl"});
  EXPECT_TRUE(files({}).train_files.empty());
  EXPECT_TRUE(files({"data.train_file="}).train_files.empty());
  EXPECT_TRUE(files({"data.train_files=null"}).train_files.empty());
  EXPECT_THAT(hybridflow::testing::error_of([&] { files({"data.train_files=[/d/a.jsonl,{x: 1}]"}); }),
              HasSubstr("data.train_file expects a list of file paths, got {\"x\":1}"));
  // total_epochs counts the rows of every file.
  hybridflow::testing::TempDir dir;
  const auto row = [](const std::string& prompt, const std::string& answer) {
    return nlohmann::json{{"prompt", prompt}, {"answer", answer}};
  };
  write_jsonl(dir.file("a.jsonl"), {row("1+1=", "2"), row("1+2=", "3")});
  write_jsonl(dir.file("b.jsonl"), {row("2+2=", "4"), row("2+3=", "5")});
  EXPECT_EQ(load_rl_config("", {"trainer.total_epochs=3", "data.train_batch_size=2",
                                "data.train_files=[" + dir.file("a.jsonl") + "," + dir.file("b.jsonl") + "]"})
                .get<int64_t>("trainer.total_steps"),
            6);
}

// Keys of verl's ppo_megatron_trainer.yaml and its examples' other habits: the Megatron engine's offloads and
// schedule name, context parallelism as Ulysses groups, its own settings dropped, the features hybridflow lacks
// accepted only at their defaults.
TEST(VerlConfig, MegatronConfigKeys) {
  const Config config = load_rl_config(
      kExample, {"actor_rollout_ref.actor.megatron.param_offload=True",
                 "actor_rollout_ref.actor.megatron.optimizer_offload=True", "critic.megatron.param_offload=True",
                 "actor_rollout_ref.actor.megatron.grad_offload=True", "actor_rollout_ref.actor.megatron.use_mbridge=True",
                 "+actor_rollout_ref.actor.megatron.override_transformer_config.recompute_method=uniform",
                 "actor_rollout_ref.actor.megatron.context_parallel_size=1",
                 "actor_rollout_ref.ref.megatron.param_offload=True", "critic.megatron.seed=42",
                 "actor_rollout_ref.actor.megatron.expert_tensor_parallel_size=null",
                 "actor_rollout_ref.actor.optim.lr_decay_style=cosine", "actor_rollout_ref.actor.optim.min_lr=0.0",
                 "actor_rollout_ref.model.lora.rank=32", "actor_rollout_ref.model.lora.alpha=64",
                 "actor_rollout_ref.model.lora.lora_A_init_method=kaiming"});
  EXPECT_EQ(config.get<int64_t>("actor_rollout_ref.model.lora_rank"), 32);
  EXPECT_EQ(config.get<double>("actor_rollout_ref.model.lora_alpha"), 64);
  EXPECT_TRUE(config.get<bool>("actor_rollout_ref.actor.fsdp_config.param_offload"));
  EXPECT_TRUE(config.get<bool>("actor_rollout_ref.actor.fsdp_config.optimizer_offload"));
  EXPECT_TRUE(config.get<bool>("critic.model.fsdp_config.param_offload"));
  EXPECT_FALSE(config.get<bool>("critic.model.fsdp_config.optimizer_offload"));
  EXPECT_EQ(config.get<std::string>("actor_rollout_ref.actor.optim.lr_scheduler_type"), "cosine");
  using hybridflow::testing::error_of;
  // Context parallelism is read as the Ulysses groups that split sequences the same way.
  const Config cp = load_rl_config(kExample, {"actor_rollout_ref.actor.megatron.context_parallel_size=2",
                                              "actor_rollout_ref.ref.megatron.context_parallel_size=2",
                                              "critic.megatron.context_parallel_size=4"});
  EXPECT_EQ(cp.get<int>("actor_rollout_ref.actor.ulysses_sequence_parallel_size"), 2);
  EXPECT_EQ(cp.get<int>("actor_rollout_ref.ref.ulysses_sequence_parallel_size"), 2);
  EXPECT_EQ(cp.get<int>("critic.ulysses_sequence_parallel_size"), 4);
  // Interleaved stages change the schedule, not the update: dropped with the warning.
  EXPECT_NO_THROW(load_rl_config(kExample, {"actor_rollout_ref.ref.megatron.virtual_pipeline_model_parallel_size=2"}));
  EXPECT_THAT(error_of([] { load_rl_config(kExample, {"actor_rollout_ref.actor.optim.min_lr=1e-6"}); }),
              HasSubstr("min_lr_ratio"));
  EXPECT_THAT(error_of([] {
                load_rl_config(kExample, {"actor_rollout_ref.model.lora.target_modules=[linear_qkv]"});
              }),
              HasSubstr("actor_rollout_ref.model.target_modules"));
}

TEST(VerlConfig, ExamplesHabitsLoggerResumePathAndValidationTemperature) {
  // trainer.logger=console (verl's tracking takes one name).
  EXPECT_EQ(rl_run_spec(load_rl_config("", {"trainer.logger=console"})).trainer.logger, std::vector<std::string>{"console"});
  // resume_from_path outside resume_path mode is not read, as in verl.
  EXPECT_EQ(rl_run_spec(load_rl_config("", {"trainer.resume_mode=auto", "trainer.resume_from_path=checkpoints/"}))
                .trainer.resume_from_path,
            "");
  EXPECT_EQ(rl_run_spec(load_rl_config("", {"trainer.resume_mode=resume_path", "trainer.resume_from_path=ck/global_step_2"}))
                .trainer.resume_from_path,
            "ck/global_step_2");
  // A validation temperature samples (verl's agent loop reads no do_sample), so n responses may differ.
  const auto val = rl_run_spec(load_rl_config("", {"actor_rollout_ref.rollout.val_kwargs.temperature=1.0",
                                                   "actor_rollout_ref.rollout.val_kwargs.n=30"}))
                       .trainer.val_kwargs;
  EXPECT_TRUE(val.do_sample);
  EXPECT_EQ(val.n, 30);
  EXPECT_FALSE(rl_run_spec(load_rl_config("", {})).trainer.val_kwargs.do_sample);
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
  // Every rollout engine's name means hybridflow's own engine; another name is an error.
  EXPECT_NO_THROW(load_rl_config(kExample, {"actor_rollout_ref.rollout.name=trtllm"}));
  EXPECT_THAT(error_of([] { load_rl_config(kExample, {"actor_rollout_ref.rollout.name=vllm_v2"}); }),
              HasSubstr("config key 'actor_rollout_ref.rollout.name' = 'vllm_v2'"));
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
    // The status cell is "renamed", or "renamed: " and a note.
    const bool renamed = line.ends_with(" | renamed |") ||
                         (line.find(" | renamed: ") != std::string::npos && line.ends_with(" |"));
    if (line.rfind("| `", 0) != 0 || !renamed) continue;
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
