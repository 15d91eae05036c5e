// The fine-tuning loops stop and resume bit for bit: a run of sft, rm or dpo stopped after step 3 of 6 (as a
// Ctrl-C stops it) leaves checkpoint-3, and the same command resumed from it runs steps 4-6 with the losses,
// gradient norms and final weights of the run that never stopped (fp32, bf16 with fp32 masters, and LoRA
// adapters); its metrics file holds each step once. resume_mode disable starts fresh, resume_path takes a named
// checkpoint, a torn one is never resumed from, and bad settings name their key. The final model directory
// shares the last checkpoint's files.
#include "hybridflow/finetune/fine_tune_checkpoint.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "hybridflow/core/jsonl.h"
#include "hybridflow/finetune/dpo.h"
#include "hybridflow/finetune/reward_model_training.h"
#include "hybridflow/finetune/sft.h"
#include "hybridflow/model/lora_config.h"
#include "hybridflow/model/pretrained.h"
#include "hybridflow/tasks/dataset.h"
#include "hybridflow/tasks/task.h"
#include "support/error_of.h"
#include "support/temp_dir.h"
#include "support/tiny_model.h"

namespace hybridflow {
namespace {

// One step's figures, the same whichever loop ran it.
struct Step {
  int64_t step;
  double loss, grad_norm;
};

struct Outcome {
  std::vector<Step> steps;
  FineTuneRunInfo info;
  std::vector<torch::Tensor> weights;  // every parameter at the end, on the CPU
};

enum class Loop { kSft, kRewardModel, kDpo };
enum class Variant { kFp32, kBf16, kLora };

class FineTuneResume : public ::testing::TestWithParam<std::tuple<Loop, Variant>> {
 protected:
  void SetUp() override {
    at::set_num_threads(1);
    TaskOptions task_options;
    task_options.min_length = 2;
    task_options.max_length = 2;
    task = make_task("reverse", task_options);
    const auto splits = make_splits(*task, 64, 16, 5);
    write_examples_jsonl(dir.file("sft_train.jsonl"), splits.train);
    write_examples_jsonl(dir.file("sft_test.jsonl"), splits.test);
    write_preference_jsonl(dir.file("pairs_train.jsonl"), make_preference_pairs(*task, splits.train, 11));
    write_preference_jsonl(dir.file("pairs_test.jsonl"), make_preference_pairs(*task, splits.test, 3));
    tok = std::make_unique<Tokenizer>(Tokenizer::from_alphabet(task->alphabet()));
  }

  // A fresh model as the command would load it (the same seed every time), in the variant's precision.
  CausalLM fresh_model(HeadKind head) const {
    CausalLM model = testing::seeded_model(testing::tiny_model_config(*tok, {}, "tiny"), 3, head);
    const Variant variant = std::get<1>(GetParam());
    if (variant == Variant::kBf16) model->to(torch::kBFloat16);
    if (variant == Variant::kLora) {
      LoraConfig lora;
      lora.rank = 4;
      model->add_lora(lora, 9);
    }
    return model;
  }

  // Runs the loop into out_dir with 6 steps; stop_after > 0 asks it to stop after that step.
  Outcome run(const std::string& out_dir, int64_t stop_after, const std::string& resume_mode = "auto",
          const std::string& resume_from = "") {
    FineTuneOptions shared;
    shared.lr = 1e-2;
    shared.batch_size = 8;
    shared.micro_batch_size = 4;
    shared.steps = 6;
    shared.eval_every = 3;
    shared.out_dir = out_dir;
    shared.resume_mode = resume_mode;
    shared.resume_from_path = resume_from;
    shared.save_every = save_every;
    shared.max_ckpt_to_keep = keep;
    int64_t done = 0;
    if (stop_after > 0) shared.stop_requested = [&done, stop_after] { return ++done >= stop_after; };
    Outcome out;
    auto take = [&](const auto& result, CausalLM& model) {
      for (const auto& m : result.history) out.steps.push_back({m.step, m.loss, m.grad_norm});
      out.info = result;
      for (const auto& p : model->parameters()) out.weights.push_back(p.detach().to(torch::kCPU, torch::kFloat).clone());
    };
    switch (std::get<0>(GetParam())) {
      case Loop::kSft: {
        SftOptions o;
        static_cast<FineTuneOptions&>(o) = shared;
        o.train_file = dir.file("sft_train.jsonl");
        o.eval_file = dir.file("sft_test.jsonl");
        o.max_new_tokens = 3;
        CausalLM model = fresh_model(HeadKind::kLanguageModel);
        take(run_sft(o, model, *tok), model);
        break;
      }
      case Loop::kRewardModel: {
        RewardModelOptions o;
        static_cast<FineTuneOptions&>(o) = shared;
        o.train_file = dir.file("pairs_train.jsonl");
        o.eval_file = dir.file("pairs_test.jsonl");
        CausalLM model = fresh_model(HeadKind::kValue);
        take(train_reward_model(o, model, *tok), model);
        break;
      }
      case Loop::kDpo: {
        DpoOptions o;
        static_cast<FineTuneOptions&>(o) = shared;
        o.train_file = dir.file("pairs_train.jsonl");
        o.eval_file = dir.file("pairs_test.jsonl");
        o.beta = 0.5;
        o.max_new_tokens = 3;
        CausalLM policy = fresh_model(HeadKind::kLanguageModel);
        CausalLM reference{nullptr};  // with LoRA: the policy with its adapters off
        if (std::get<1>(GetParam()) != Variant::kLora) reference = fresh_model(HeadKind::kLanguageModel);
        take(train_dpo(o, policy, reference, *tok), policy);
        break;
      }
    }
    return out;
  }

  std::string metrics_file(const std::string& out_dir) const {
    switch (std::get<0>(GetParam())) {
      case Loop::kSft: return out_dir + "/sft_metrics.jsonl";
      case Loop::kRewardModel: return out_dir + "/rm_metrics.jsonl";
      case Loop::kDpo: return out_dir + "/dpo_metrics.jsonl";
    }
    return "";
  }

  int64_t save_every = 0, keep = 0;  // the next runs' FineTuneOptions
  testing::TempDir dir;
  std::unique_ptr<Task> task;
  std::unique_ptr<Tokenizer> tok;
};

TEST_P(FineTuneResume, AStoppedRunResumesBitForBit) {
  const Outcome whole = run(dir.file("whole"), 0);
  ASSERT_EQ(whole.steps.size(), 6u);
  EXPECT_FALSE(whole.info.stopped);
  EXPECT_EQ(whole.info.last_checkpoint, checkpoint_dir(dir.file("whole"), 6));

  const Outcome first = run(dir.file("stopped"), 3);
  ASSERT_EQ(first.steps.size(), 3u);
  EXPECT_TRUE(first.info.stopped);
  EXPECT_EQ(first.info.last_checkpoint, checkpoint_dir(dir.file("stopped"), 3));
  const Outcome rest = run(dir.file("stopped"), 0);
  EXPECT_EQ(rest.info.resumed_step, 3);
  ASSERT_EQ(rest.steps.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(first.steps[i].loss, whole.steps[i].loss) << "step " << i + 1;
    EXPECT_EQ(rest.steps[i].step, whole.steps[i + 3].step);
    EXPECT_EQ(rest.steps[i].loss, whole.steps[i + 3].loss) << "step " << i + 4;
    EXPECT_EQ(rest.steps[i].grad_norm, whole.steps[i + 3].grad_norm) << "step " << i + 4;
  }
  ASSERT_EQ(rest.weights.size(), whole.weights.size());
  for (size_t i = 0; i < whole.weights.size(); ++i) EXPECT_TRUE(torch::equal(rest.weights[i], whole.weights[i])) << i;
  // Each step's metrics row once, in order.
  std::vector<int64_t> logged;
  for (const auto& row : read_jsonl(metrics_file(dir.file("stopped")))) logged.push_back(row.at("step").get<int64_t>());
  EXPECT_EQ(logged, (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
}

TEST_P(FineTuneResume, ResumeModesAndTornCheckpoints) {
  const std::string out = dir.file("out");
  run(out, 3);  // checkpoint-3
  // A checkpoint the crash left unfinished (no optimizer state) and a temporary directory are never resumed from.
  std::filesystem::create_directories(out + "/checkpoint-5");
  std::filesystem::create_directories(out + "/checkpoint-4.tmp");
  EXPECT_EQ(latest_fine_tune_checkpoint(out), checkpoint_dir(out, 3));
  const Outcome fresh = run(out, 2, "disable");  // stops after step 2: checkpoint-2 beside checkpoint-3
  EXPECT_EQ(fresh.info.resumed_step, 0);
  EXPECT_EQ(fresh.steps.front().step, 1);
  std::vector<int64_t> logged;
  for (const auto& row : read_jsonl(metrics_file(out))) logged.push_back(row.at("step").get<int64_t>());
  EXPECT_EQ(logged, (std::vector<int64_t>{1, 2}));  // a fresh run's rows only
  const Outcome named = run(out, 0, "resume_path", checkpoint_dir(out, 2));
  EXPECT_EQ(named.info.resumed_step, 2);
  EXPECT_EQ(named.steps.front().step, 3);
  EXPECT_NE(testing::error_of([&] { run(out, 0, "sometimes"); }).find("trainer.resume_mode"), std::string::npos);
  EXPECT_NE(testing::error_of([&] { run(out, 0, "resume_path", out + "/checkpoint-5"); }).find("trainer.resume_from_path"),
            std::string::npos);
  EXPECT_NE(testing::error_of([&] { run(out, 0, "resume_path"); }).find("trainer.resume_from_path is empty"),
            std::string::npos);
}

std::string case_name(const ::testing::TestParamInfo<std::tuple<Loop, Variant>>& info) {
  static const char* const loops[] = {"Sft", "RewardModel", "Dpo"};
  static const char* const variants[] = {"Fp32", "Bf16", "Lora"};
  return std::string(loops[static_cast<int>(std::get<0>(info.param))]) +
         variants[static_cast<int>(std::get<1>(info.param))];
}

// Checkpoints every step, the newest two kept: after six steps only checkpoint-5 and checkpoint-6 remain, and a
// stop keeps its own and the one before.
TEST_P(FineTuneResume, OnlyTheNewestCheckpointsAreKept) {
  save_every = 1;
  keep = 2;
  const std::string out = dir.file("kept");
  run(out, 0);
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(out))
    if (entry.path().filename().string().starts_with("checkpoint-")) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"checkpoint-5", "checkpoint-6"}));
  EXPECT_EQ(remove_old_fine_tune_checkpoints(out, 1), 1);
  EXPECT_EQ(latest_fine_tune_checkpoint(out), checkpoint_dir(out, 6));
  EXPECT_NE(testing::error_of([&] { remove_old_fine_tune_checkpoints(out, 0); }).find("trainer.max_ckpt_to_keep"),
            std::string::npos);
}

// The final model directory holds the last checkpoint's model files by hard link (its weights are on disk
// once), not its optimizer state, and stays whole when the checkpoint goes; with no checkpoint it is written.
TEST_P(FineTuneResume, TheFinalModelSharesTheLastCheckpointsFiles) {
  const std::string out = dir.file("final_links");
  const Outcome outcome = run(out, 0);
  ASSERT_EQ(outcome.info.last_checkpoint, checkpoint_dir(out, 6));
  const HeadKind head = std::get<0>(GetParam()) == Loop::kRewardModel ? HeadKind::kValue : HeadKind::kLanguageModel;
  const CausalLM other = fresh_model(head);  // other weights: written only where nothing is linked
  const std::string final_dir = out + "/final";
  EXPECT_GE(save_final_model(final_dir, outcome.info.last_checkpoint, other, *tok), 3);  // config, weights, tokenizer
  EXPECT_TRUE(std::filesystem::equivalent(final_dir + "/model.safetensors",  // one file, two names
                                          checkpoint_dir(out, 6) + "/model.safetensors"));
  EXPECT_FALSE(std::filesystem::exists(final_dir + "/optimizer.pt"));
  EXPECT_FALSE(std::filesystem::exists(final_dir + ".tmp"));
  std::filesystem::remove_all(checkpoint_dir(out, 6));
  const Pretrained loaded = load_pretrained(final_dir, head);
  if (std::get<1>(GetParam()) != Variant::kLora) {  // a LoRA run's model file holds the base weights
    const auto params = loaded.model->parameters();
    ASSERT_EQ(params.size(), outcome.weights.size());
    for (size_t i = 0; i < params.size(); ++i)
      EXPECT_TRUE(torch::equal(params[i].detach().to(torch::kFloat), outcome.weights[i])) << "parameter " << i;
  }
  // No checkpoint to link: the model is written.
  EXPECT_EQ(save_final_model(final_dir, "", other, *tok), 0);
  const Pretrained written = load_pretrained(final_dir, head);
  EXPECT_TRUE(torch::equal(written.model->parameters()[0].to(torch::kFloat), other->parameters()[0].to(torch::kFloat)));
}

INSTANTIATE_TEST_SUITE_P(Loops, FineTuneResume,
                         ::testing::Combine(::testing::Values(Loop::kSft, Loop::kRewardModel, Loop::kDpo),
                                            ::testing::Values(Variant::kFp32, Variant::kBf16, Variant::kLora)),
                         case_name);

}  // namespace
}  // namespace hybridflow
