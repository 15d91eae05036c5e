// `hybridflow dpo` as a user runs it: a short run from a model directory writes its pairs, metrics and a
// final model that differs from the start, and the shipped example runs (with LoRA: test_cli_finetune_lora).
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "hybridflow/core/jsonl.h"
#include "hybridflow/model/pretrained.h"
#include "support/run_command.h"
#include "support/temp_dir.h"

namespace {

using hybridflow::testing::CommandResult;
using hybridflow::testing::run_hybridflow;

const char* kSmallRun =
    " trainer.steps=6 trainer.batch_size=8 trainer.micro_batch_size=4 trainer.eval_every=3 trainer.eval_samples=8 "
    "data.max_digits=1 data.train_size=32 data.test_size=8 trainer.threads=1 optim.lr=0.01 optim.warmup_steps=0 ";

TEST(CliDpo, ShortRunWritesPairsMetricsAndATrainedModel) {
  hybridflow::testing::TempDir dir;
  ASSERT_EQ(run_hybridflow("init --preset tiny --task addition --seed 3 --out " + dir.file("m")).exit_code, 0);
  const std::string out = dir.file("dpo");
  CommandResult r = run_hybridflow("dpo model.path=" + dir.file("m") + kSmallRun + "trainer.out_dir=" + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("data: 64 train / 8 held-out addition preference pairs"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("eval step 3: held-out exact match"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("dpo summary: 6 steps, held-out exact match"), std::string::npos) << r.output;
  EXPECT_EQ(hybridflow::read_jsonl(out + "/data/test_pairs.jsonl").size(), 8u);
  EXPECT_TRUE(std::filesystem::exists(out + "/dpo_metrics.jsonl"));
  auto start = hybridflow::load_pretrained(dir.file("m"));
  auto trained = hybridflow::load_pretrained(out + "/final");
  auto before = start.model->named_parameters();
  double moved = 0;
  for (const auto& item : trained.model->named_parameters())
    moved += (item.value() - before[item.key()]).abs().sum().item<double>();
  EXPECT_GT(moved, 0.0);
}

TEST(CliDpo, ShippedExampleRunsAndBadKeysAreNamed) {
  hybridflow::testing::TempDir dir;
  ASSERT_EQ(run_hybridflow("init --preset tiny --task addition --seed 3 --out " + dir.file("m")).exit_code, 0);
  const std::string example =
      (std::filesystem::path(__FILE__).parent_path().parent_path().parent_path() / "examples/dpo_addition.yaml").string();
  CommandResult r = run_hybridflow("dpo --config " + example + " model.path=" + dir.file("m") +
                                   " data.train_size=16 data.test_size=4 trainer.steps=2 trainer.eval_every=0 "
                                   "trainer.threads=1 trainer.out_dir=" + dir.file("dpo"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(std::filesystem::exists(dir.file("dpo/final/model.safetensors")));
  r = run_hybridflow("dpo model.path=" + dir.file("m") + " dpo.loss_type=hinge trainer.out_dir=" + dir.file("bad"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("dpo.loss_type"), std::string::npos) << r.output;
  r = run_hybridflow("dpo model.path=" + dir.file("m") + " dpo.beta=0 trainer.out_dir=" + dir.file("bad"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("dpo.beta"), std::string::npos) << r.output;
}

// dpo.loss_type simpo and orpo read no reference model: a model.ref_path that does not exist is never opened,
// and the runs train and report as the others do.
TEST(CliDpo, SimpoAndOrpoLoadNoReference) {
  hybridflow::testing::TempDir dir;
  ASSERT_EQ(run_hybridflow("init --preset tiny --task addition --seed 3 --out " + dir.file("m")).exit_code, 0);
  for (const std::string loss : {"simpo", "orpo"}) {
    const CommandResult r = run_hybridflow("dpo model.path=" + dir.file("m") + " model.ref_path=" + dir.file("absent") +
                                           " dpo.loss_type=" + loss + kSmallRun + "trainer.out_dir=" + dir.file(loss));
    ASSERT_EQ(r.exit_code, 0) << loss << "\n" << r.output;
    EXPECT_NE(r.output.find("dpo summary: 6 steps, held-out exact match"), std::string::npos) << r.output;
    EXPECT_TRUE(std::filesystem::exists(dir.file(loss + "/final/model.safetensors"))) << loss;
  }
  // The same missing reference is an error for a loss that needs one.
  const CommandResult r = run_hybridflow("dpo model.path=" + dir.file("m") + " model.ref_path=" + dir.file("absent") +
                                         kSmallRun + "trainer.out_dir=" + dir.file("sigmoid"));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(dir.file("absent")), std::string::npos) << r.output;
}

}  // namespace
