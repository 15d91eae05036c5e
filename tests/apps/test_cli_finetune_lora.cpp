// `hybridflow sft`, `hybridflow rm` and `hybridflow dpo` with LoRA (model.lora_rank): the final directory holds
// the base model untouched and the trained adapters beside it in PEFT's format, which reproduce what the run
// reported.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "hybridflow/finetune/reward_model_training.h"
#include "hybridflow/model/lora.h"
#include "hybridflow/model/pretrained.h"
#include "support/run_command.h"
#include "support/temp_dir.h"

namespace {

using hybridflow::testing::CommandResult;
using hybridflow::testing::run_hybridflow;

// The value of "<label> -> X" after `summary` in a command's output.
double reported_after_arrow(const std::string& output, const std::string& summary) {
  const size_t at = output.find(summary);
  EXPECT_NE(at, std::string::npos) << output;
  const size_t arrow = output.find("-> ", at);
  EXPECT_NE(arrow, std::string::npos) << output;
  return std::stod(output.substr(arrow + 3));
}

// The final directory holds the base model as it was, and the adapters beside it have trained (B no longer
// zero).
void expect_base_untouched_and_adapters_trained(const std::string& base_dir, const std::string& final_dir) {
  auto base = hybridflow::load_pretrained(base_dir);
  auto final_model = hybridflow::load_pretrained(final_dir);
  auto want = base.model->named_parameters();
  for (const auto& item : final_model.model->named_parameters())
    EXPECT_TRUE(torch::equal(item.value(), want[item.key()])) << item.key();
  hybridflow::load_lora_adapter(final_dir + "/lora_adapter", final_model.model);
  double b_norm = 0;
  for (const auto& [name, tensor] : hybridflow::lora_adapter_tensors(final_model.model))
    if (name.find("lora_B") != std::string::npos) b_norm += tensor.abs().sum().item<double>();
  EXPECT_GT(b_norm, 0.0);
}

TEST(CliFinetuneLora, SftTrainsOnlyAdaptersAndSavesThemBesideTheUntouchedBase) {
  hybridflow::testing::TempDir dir;
  ASSERT_EQ(run_hybridflow("init --preset tiny --task addition --seed 3 --out " + dir.file("m")).exit_code, 0);
  const std::string out = dir.file("sft");
  CommandResult r = run_hybridflow("sft model.path=" + dir.file("m") +
                                   " model.lora_rank=8 model.lora_alpha=16 trainer.steps=6 trainer.batch_size=8 "
                                   "trainer.micro_batch_size=8 trainer.eval_every=0 trainer.eval_samples=4 "
                                   "data.train_size=64 data.test_size=4 trainer.threads=1 optim.lr=0.01 "
                                   "trainer.out_dir=" + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("LoRA adapters in " + out + "/final/lora_adapter"), std::string::npos) << r.output;
  expect_base_untouched_and_adapters_trained(dir.file("m"), out + "/final");
}

TEST(CliFinetuneLora, DpoTrainsOnlyAdaptersAgainstTheBaseAsItsReference) {
  hybridflow::testing::TempDir dir;
  ASSERT_EQ(run_hybridflow("init --preset tiny --task addition --seed 3 --out " + dir.file("m")).exit_code, 0);
  const std::string out = dir.file("dpo");
  CommandResult r = run_hybridflow("dpo model.path=" + dir.file("m") +
                                   " model.lora_rank=4 trainer.steps=6 trainer.batch_size=8 trainer.micro_batch_size=4 "
                                   "trainer.eval_every=0 trainer.eval_samples=4 data.max_digits=1 data.train_size=32 "
                                   "data.test_size=4 trainer.threads=1 optim.lr=0.01 trainer.out_dir=" + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("LoRA adapters in " + out + "/final/lora_adapter"), std::string::npos) << r.output;
  expect_base_untouched_and_adapters_trained(dir.file("m"), out + "/final");
}

TEST(CliFinetuneLora, RmSavesAdaptersThatReproduceTheReportedAccuracy) {
  hybridflow::testing::TempDir dir;
  const std::string out = dir.file("rm");
  CommandResult r = run_hybridflow(
      "rm trainer.steps=30 trainer.eval_every=0 trainer.threads=1 model.hidden_size=32 model.num_hidden_layers=1 "
      "model.intermediate_size=64 model.lora_rank=4 model.target_modules=[q_proj,v_proj] data.train_size=64 "
      "data.test_size=40 trainer.out_dir=" + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const double reported = reported_after_arrow(r.output, "rm summary: 30 steps, held-out pairwise accuracy ");
  auto loaded = hybridflow::load_pretrained(out + "/final", hybridflow::HeadKind::kValue);
  hybridflow::load_lora_adapter(out + "/final/lora_adapter", loaded.model);
  EXPECT_EQ(hybridflow::lora_adapter_tensors(loaded.model).size(), 4u);  // A and B of q_proj and v_proj
  EXPECT_NEAR(hybridflow::pairwise_accuracy(loaded.model, loaded.tokenizer, out + "/data/test_pairs.jsonl"), reported,
              1e-3);
}

TEST(CliFinetuneLora, AnUnknownTargetModuleNamesTheKey) {
  hybridflow::testing::TempDir dir;
  CommandResult r = run_hybridflow("rm trainer.steps=1 model.lora_rank=4 model.target_modules=[c_attn] trainer.out_dir=" +
                                   dir.file("rm"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("model.target_modules: 'c_attn'"), std::string::npos) << r.output;
}

}  // namespace
