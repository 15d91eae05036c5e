// GRPO with LoRA (actor_rollout_ref.model.lora_rank) over real worker processes: the run writes the same
// numbers colocated and with a standalone rollout pool, whose weight sync then moves only the adapters (far
// fewer bytes than the whole model's sync); the reference policy (use_kl_loss) is the actor with its
// adapters off; ZeRO-1 partitions the adapters' optimizer state; two pipeline stages that generate through the
// 3D-HybridEngine on merged weights follow two data-parallel ranks; the adapters are saved in PEFT's format
// at the end of the run. Bad LoRA settings fail at start naming their key.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "hybridflow/core/fs.h"
#include "hybridflow/core/jsonl.h"
#include "hybridflow/model/lora.h"
#include "hybridflow/runtime/worker_main.h"
#include "hybridflow/trainer/rl_trainer.h"
#include "hybridflow/workers/rl_workers.h"
#include "support/error_of.h"
#include "support/temp_dir.h"
#include "support/tiny_rl_config.h"

using namespace hybridflow;
using ::testing::HasSubstr;

static const bool kRanAsWorker = (register_rl_workers(), run_worker_if_requested());

namespace {

constexpr int kSteps = 3;

struct LoraRun {
  std::vector<nlohmann::json> metrics;
  double actor_norm = 0;
  bool adapter_saved = false;
};

std::vector<std::string> lora_overrides(const std::vector<std::string>& extra) {
  // A graded reward (the share of digits in the response): a random policy earns some of it, so GRPO's
  // advantages are not all zero and the adapters move.
  std::vector<std::string> o = {"reward.type=command",
                                "reward.shell=/usr/bin/python3 -c \"import sys,json; [print(sum(c.isdigit() for c in "
                                "json.loads(l)['response']) / 4.0, flush=True) for l in sys.stdin]\"",
                                "actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.model.lora_alpha=8",
                                "actor_rollout_ref.actor.use_kl_loss=true",
                                "actor_rollout_ref.actor.optim.lr=2e-2",
                                "trainer.total_steps=" + std::to_string(kSteps), "trainer.log_samples_freq=0"};
  o.insert(o.end(), extra.begin(), extra.end());
  return hybridflow::testing::tiny_rl_overrides("grpo", o);
}

LoraRun train(const std::vector<std::string>& extra) {
  hybridflow::testing::TempDir dir;
  std::vector<std::string> o = lora_overrides(extra);
  o.push_back("trainer.run_dir=" + dir.path());
  RLTrainer trainer(load_rl_config("", o));
  trainer.fit();
  LoraRun run;
  run.metrics = read_jsonl(dir.path() + "/metrics.jsonl");
  run.actor_norm = trainer.parameter_sq_norm("actor");
  run.adapter_saved = file_exists(dir.path() + "/lora_adapter/actor/adapter_model.safetensors") &&
                      file_exists(dir.path() + "/lora_adapter/actor/adapter_config.json");
  return run;
}

double last_metric(const LoraRun& run, const std::string& key) { return run.metrics.back().at(key).get<double>(); }

// What does not depend on where roles run or on the clock.
bool placement_independent(const std::string& key) {
  const bool seconds = key.size() > 2 && key.compare(key.size() - 2, 2, "_s") == 0;
  return !seconds && key.rfind("timing/", 0) != 0 && key.rfind("perf/", 0) != 0 && key.rfind("memory/", 0) != 0 &&
         key.rfind("weight_sync/", 0) != 0;
}

std::string start_error(const std::vector<std::string>& extra) {
  return hybridflow::testing::error_of([&] { RLTrainer trainer(load_rl_config("", lora_overrides(extra))); });
}

}  // namespace

TEST(RlLora, StandaloneRolloutSyncsOnlyTheAdaptersAndMatchesColocate) {
  const LoraRun colocated = train({"trainer.placement=colocate"});
  const LoraRun standalone = train({"trainer.placement=standalone"});
  const LoraRun full = train({"trainer.placement=standalone", "actor_rollout_ref.model.lora_rank=0"});
  ASSERT_EQ(colocated.metrics.size(), static_cast<size_t>(kSteps));
  ASSERT_EQ(standalone.metrics.size(), colocated.metrics.size());
  for (size_t i = 0; i < colocated.metrics.size(); ++i)
    for (const auto& [key, value] : colocated.metrics[i].items()) {
      if (placement_independent(key)) {
        EXPECT_EQ(standalone.metrics[i].at(key), value) << "step " << i + 1 << ": " << key;
      }
    }
  EXPECT_EQ(standalone.actor_norm, colocated.actor_norm);
  // The reference (the actor with its adapters off) ran: the KL loss against it is there, and moves.
  EXPECT_GT(last_metric(colocated, "actor/kl_loss"), 0.0);
  // Only the adapters travel: rank-4 adapters of a 1-layer model against the whole model's weights.
  const double lora_bytes = last_metric(standalone, "weight_sync/bytes");
  const double full_bytes = last_metric(full, "weight_sync/bytes");
  EXPECT_GT(lora_bytes, 0.0);
  EXPECT_LT(lora_bytes * 5, full_bytes) << "LoRA sync " << lora_bytes << " bytes, full sync " << full_bytes;
  EXPECT_TRUE(colocated.adapter_saved && standalone.adapter_saved) << "<run_dir>/lora_adapter/actor";
  EXPECT_FALSE(full.adapter_saved);
  // Only the adapters hold optimizer state: a small fraction of full fine-tuning's.
  EXPECT_LT(last_metric(colocated, "actor/optimizer_state_bytes") * 5, last_metric(full, "actor/optimizer_state_bytes"));
}

TEST(RlLora, ZeroOnePartitionsTheAdaptersOptimizerState) {
  const std::vector<std::string> two = {"actor_rollout_ref.num_processes=2", "data.train_batch_size=4",
                                        "actor_rollout_ref.actor.ppo_mini_batch_size=4"};
  std::vector<std::string> zero = two;
  zero.push_back("actor_rollout_ref.actor.megatron.use_distributed_optimizer=true");
  const LoraRun replicated = train(two);
  const LoraRun partitioned = train(zero);
  const double whole = last_metric(replicated, "actor/optimizer_state_bytes");
  const double part = last_metric(partitioned, "actor/optimizer_state_bytes");
  // Each of the 2 ranks holds half of the adapters' two moments and half of their fp32 master (ZeRO's
  // partition steps a master copy): 1.5 of the replicated 2 copies.
  EXPECT_NEAR(part, whole * 3 / 4, whole * 0.01) << part << " of " << whole;
  EXPECT_NEAR(partitioned.actor_norm, replicated.actor_norm, 1e-6 * replicated.actor_norm);
}

TEST(RlLora, PipelineStagesGenerateOnMergedWeightsThroughTheHybridEngine) {
  // Two stages generating unstaged (the 3D-HybridEngine gathers the merged weights, then the actor unmerges)
  // against two data-parallel ranks generating on their own weights: the same run within float rounding.
  const std::vector<std::string> two = {"model.num_hidden_layers=2", "actor_rollout_ref.num_processes=2",
                                        "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4"};
  std::vector<std::string> two_stages = two;
  two_stages.push_back("actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2");
  RLTrainer piped(load_rl_config("", lora_overrides(two_stages)));
  RLTrainer plain(load_rl_config("", lora_overrides(two)));
  for (int step = 1; step <= kSteps; ++step) {
    const nlohmann::json a = piped.step();
    const nlohmann::json b = plain.step();
    EXPECT_GT(a.at("reshard/model_bytes").get<double>(), 0) << "the engine switched layouts";
    for (const char* key : {"score/mean", "response_length/mean"})
      EXPECT_NEAR(a.at(key).get<double>(), b.at(key).get<double>(), 1e-5) << key << " at step " << step;
    // Not actor/pg_loss nor actor/kl_loss: each is the mean of the micro-batches' token means, which depends on
    // how rows are grouped (the stages take micro-batches of the whole batch, the ranks the halves that
    // balance_batch gives them; without LoRA alike), and the KL's values are small enough (~1e-3) that the
    // grouping moves it past the tolerance. The gradient's norm is the loss's whole gradient.
    for (const char* key : {"actor/entropy", "actor/grad_norm"}) {
      const double want = b.at(key).get<double>();
      EXPECT_NEAR(a.at(key).get<double>(), want, 1e-4 + 1e-4 * std::abs(want)) << key << " at step " << step;
    }
  }
  const double want = plain.parameter_sq_norm("actor");
  EXPECT_NEAR(piped.parameter_sq_norm("actor"), want, 1e-5 * want);
}

TEST(RlLora, AnAdapterDirectoryStartsTheRun) {
  hybridflow::testing::TempDir first;
  {
    RLTrainer trainer(load_rl_config("", lora_overrides({"trainer.run_dir=" + first.path()})));
    // Fresh adapters (B = 0) leave the policy the base model: no KL against the reference yet (but for
    // the rounding of other micro-batch shapes).
    EXPECT_LT(trainer.step().at("actor/kl_loss").get<double>(), 1e-6);
    trainer.fit();
  }
  const std::string adapter = first.path() + "/lora_adapter/actor";
  ASSERT_TRUE(file_exists(adapter + "/adapter_config.json"));
  // rank 0: the directory's adapter_config.json sets it. The trained adapters start the policy off the base.
  RLTrainer trainer(load_rl_config("", lora_overrides({"actor_rollout_ref.model.lora_rank=0",
                                                       "actor_rollout_ref.model.lora_adapter_path=" + adapter})));
  EXPECT_GT(trainer.step().at("actor/kl_loss").get<double>(), 1e-5);
}

TEST(RlLora, BadSettingsFailAtStartNamingTheKey) {
  EXPECT_THAT(start_error({"actor_rollout_ref.model.target_modules=[qkv_proj]"}),
              HasSubstr("actor_rollout_ref.model.target_modules: 'qkv_proj'"));
  EXPECT_THAT(start_error({"actor_rollout_ref.model.target_modules=q.*"}),
              HasSubstr("actor_rollout_ref.model.target_modules = 'q.*' matches the whole path of no projection"));
  EXPECT_THAT(start_error({"actor_rollout_ref.model.lora_rank=1000"}),
              HasSubstr("actor_rollout_ref.model.lora_rank 1000 is larger than"));
  EXPECT_THAT(start_error({"trainer.placement=standalone", "actor_rollout_ref.rollout.num_processes=2",
                           "actor_rollout_ref.rollout.tensor_model_parallel_size=2"}),
              HasSubstr("actor_rollout_ref.rollout.tensor_model_parallel_size = 1"));
  EXPECT_THAT(start_error({"actor_rollout_ref.num_processes=2", "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2",
                           "actor_rollout_ref.rollout.lora_merge=false"}),
              HasSubstr("actor_rollout_ref.rollout.lora_merge = false"));
  // PEFT options hybridflow does not implement, and an adapter of another model.
  hybridflow::testing::TempDir dir;
  make_dirs(dir.file("dora"));
  write_file_atomic(dir.file("dora/adapter_config.json"),
                    R"({"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj"], "use_dora": true})");
  const std::string dora = start_error({"actor_rollout_ref.model.lora_adapter_path=" + dir.file("dora")});
  EXPECT_THAT(dora, HasSubstr("actor_rollout_ref.model.lora_adapter_path"));
  EXPECT_THAT(dora, HasSubstr("use_dora"));
  make_dirs(dir.file("r4"));
  write_file_atomic(dir.file("r4/adapter_config.json"),
                    R"({"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj"]})");
  EXPECT_THAT(start_error({"actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.lora_adapter_path=" + dir.file("r4")}),
              HasSubstr("actor_rollout_ref.model.lora_rank = 8 disagrees with r = 4"));
}
