// `hybridflow rm` as a user runs it: a short training run whose saved model loads as a value-head model
// and ranks the held-out pairs exactly as the run reported.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <string>

#include "hybridflow/engine/reward_model_training.h"
#include "hybridflow/model/pretrained.h"
#include "hybridflow/tasks/dataset.h"
#include "support/temp_dir.h"

namespace {

struct Result {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

Result run(const std::string& args) {
  std::string cmd = std::string(HF_BINARY) + " " + args + " 2>&1";
  Result r;
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (pipe == nullptr) return r;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), pipe)) > 0) r.output.append(buf.data(), n);
  int status = ::pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

TEST(CliRm, ShortRunSavesAValueHeadModelThatReproducesTheReportedAccuracy) {
  hybridflow::testing::TempDir dir;
  const std::string out = dir.file("rm");
  Result r = run("rm trainer.steps=40 trainer.eval_every=20 trainer.threads=1 model.hidden_size=32 "
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
  const auto pairs = hybridflow::read_preference_jsonl(out + "/data/test_pairs.jsonl");
  EXPECT_EQ(pairs.size(), 40u);
  EXPECT_NEAR(hybridflow::pairwise_accuracy(loaded.model, loaded.tokenizer, pairs), reported, 1e-3);
  EXPECT_TRUE(std::filesystem::exists(out + "/rm_metrics.jsonl"));
  EXPECT_TRUE(std::filesystem::exists(out + "/config.yaml"));
}

TEST(CliRm, ShippedExampleRunsFromAPreset) {
  hybridflow::testing::TempDir dir;
  const std::string example =
      (std::filesystem::path(__FILE__).parent_path().parent_path().parent_path() / "examples/rm_addition.yaml").string();
  // The example starts from the quickstart's SFT model; a preset keeps this test self-contained.
  Result r = run("rm --config " + example + " model.path='\"\"' model.hidden_size=32 model.num_hidden_layers=1 "
                 "model.intermediate_size=64 data.train_size=32 data.test_size=16 trainer.steps=2 "
                 "trainer.eval_every=0 trainer.threads=1 trainer.out_dir=" + dir.file("rm"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("128 train / 16 held-out addition preference pairs"), std::string::npos) << r.output;
  EXPECT_TRUE(std::filesystem::exists(dir.file("rm/final/model.safetensors")));
}

TEST(CliRm, MissingPairFileIsNamed) {
  hybridflow::testing::TempDir dir;
  Result r = run("rm data.train_file=/nonexistent/pairs.jsonl trainer.out_dir=" + dir.file("rm"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("/nonexistent/pairs.jsonl"), std::string::npos) << r.output;
}

}  // namespace
