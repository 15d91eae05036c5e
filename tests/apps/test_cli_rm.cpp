// `hybridflow rm` as a user runs it: a short training run whose saved model loads as a value-head model
// and ranks the held-out pairs exactly as the run reported.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "hybridflow/core/jsonl.h"
#include "hybridflow/finetune/reward_model_training.h"
#include "hybridflow/model/pretrained.h"
#include "support/run_command.h"
#include "support/temp_dir.h"

namespace {

using hybridflow::testing::CommandResult;
using hybridflow::testing::run_hybridflow;

TEST(CliRm, ShortRunSavesAValueHeadModelThatReproducesTheReportedAccuracy) {
  hybridflow::testing::TempDir dir;
  const std::string out = dir.file("rm");
  CommandResult r = run_hybridflow(
      "rm trainer.steps=40 trainer.eval_every=20 trainer.threads=1 model.hidden_size=32 "
      "model.num_hidden_layers=1 model.intermediate_size=64 data.train_size=64 data.test_size=40 "
      "trainer.out_dir=" + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("eval step 20: held-out pairwise accuracy"), std::string::npos) << r.output;
  const size_t at = r.output.find("rm summary: 40 steps, held-out pairwise accuracy ");
  ASSERT_NE(at, std::string::npos) << r.output;
  const size_t arrow = r.output.find("-> ", at);
  ASSERT_NE(arrow, std::string::npos) << r.output;
  const double reported = std::stod(r.output.substr(arrow + 3));

  auto loaded = hybridflow::load_pretrained(out + "/final", hybridflow::HeadKind::kValue);
  EXPECT_EQ(hybridflow::read_jsonl(out + "/data/test_pairs.jsonl").size(), 40u);
  EXPECT_NEAR(hybridflow::pairwise_accuracy(loaded.model, loaded.tokenizer, out + "/data/test_pairs.jsonl"), reported,
              1e-3);
  // The final model is the last checkpoint's weights, on disk once.
  EXPECT_TRUE(std::filesystem::equivalent(out + "/final/model.safetensors", out + "/checkpoint-40/model.safetensors"));
  EXPECT_TRUE(std::filesystem::exists(out + "/rm_metrics.jsonl"));
  EXPECT_TRUE(std::filesystem::exists(out + "/config.yaml"));
}

TEST(CliRm, ShippedExampleRunsFromAPreset) {
  hybridflow::testing::TempDir dir;
  const std::string example =
      (std::filesystem::path(__FILE__).parent_path().parent_path().parent_path() / "examples/rm_addition.yaml").string();
  // The example starts from the quickstart's SFT model; a preset keeps this test self-contained.
  CommandResult r = run_hybridflow(
      "rm --config " + example + " model.path='\"\"' model.hidden_size=32 model.num_hidden_layers=1 "
      "model.intermediate_size=64 data.train_size=32 data.test_size=16 trainer.steps=2 "
      "trainer.eval_every=0 trainer.threads=1 trainer.out_dir=" + dir.file("rm"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("128 train / 16 held-out addition preference pairs"), std::string::npos) << r.output;
  EXPECT_TRUE(std::filesystem::exists(dir.file("rm/final/model.safetensors")));
}

TEST(CliRm, MissingPairFileIsNamed) {
  hybridflow::testing::TempDir dir;
  CommandResult r = run_hybridflow("rm data.train_file=/nonexistent/pairs.jsonl trainer.out_dir=" + dir.file("rm"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("/nonexistent/pairs.jsonl"), std::string::npos) << r.output;
}

}  // namespace
