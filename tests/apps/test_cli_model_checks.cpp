// `hybridflow info` and `init` against broken or absurd models: a truncated weight file, a config.json that
// does not match its weights, sizes no machine holds. Each must exit non-zero naming the problem.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "support/run_command.h"
#include "support/temp_dir.h"

namespace {

using hybridflow::testing::CommandResult;
using hybridflow::testing::run_hybridflow;

std::string contents(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

class CliModelChecks : public ::testing::Test {
 protected:
  void SetUp() override {
    CommandResult init = run_hybridflow("init --preset tiny --task addition --out " + model());
    ASSERT_EQ(init.exit_code, 0) << init.output;
  }
  std::string model() const { return dir.file("m"); }
  hybridflow::testing::TempDir dir;
};

TEST_F(CliModelChecks, InfoSaysAWholeModelIsFine) {
  CommandResult info = run_hybridflow("info " + model());
  ASSERT_EQ(info.exit_code, 0) << info.output;
  EXPECT_NE(info.output.find("weights          ok"), std::string::npos) << info.output;
}

TEST_F(CliModelChecks, InfoReportsATruncatedWeightFile) {
  const std::string weights = model() + "/model.safetensors";
  std::filesystem::resize_file(weights, std::filesystem::file_size(weights) / 2);
  CommandResult info = run_hybridflow("info " + model());
  EXPECT_EQ(info.exit_code, 1) << info.output;
  EXPECT_NE(info.output.find("problem: " + weights + ": tensor '"), std::string::npos) << info.output;
  EXPECT_NE(info.output.find("(file truncated?)"), std::string::npos) << info.output;
  EXPECT_NE(info.output.find("this model will not load"), std::string::npos) << info.output;
}

TEST_F(CliModelChecks, InfoReportsAConfigThatDoesNotMatchTheWeights) {
  nlohmann::json config = nlohmann::json::parse(contents(model() + "/config.json"));
  config["num_hidden_layers"] = 6;
  config["intermediate_size"] = 400;
  std::ofstream(model() + "/config.json") << config.dump();
  CommandResult info = run_hybridflow("info " + model());
  EXPECT_EQ(info.exit_code, 1) << info.output;
  EXPECT_NE(info.output.find("weights do not match config.json: missing [model.layers.4."), std::string::npos)
      << info.output;
  EXPECT_NE(info.output.find("wrong shape [model.layers.0.mlp.gate_proj.weight (file [344, 128], model [400, 128])"),
            std::string::npos)
      << info.output;
}

TEST(CliModelSize, InitWithAnAbsurdVocabularyFailsBeforeAllocating) {
  // --vocab-multiple pads the embedding: 10^11 rows x 128 is ~100 TB of float32.
  hybridflow::testing::TempDir dir;
  CommandResult init =
      run_hybridflow("init --preset tiny --task addition --vocab-multiple 100000000000 --out " + dir.file("huge"));
  EXPECT_NE(init.exit_code, 0) << init.output;
  EXPECT_NE(init.output.find("from vocab_size (100000000000) x hidden_size (128)"), std::string::npos) << init.output;
  EXPECT_NE(init.output.find("available ("), std::string::npos) << init.output;
  EXPECT_FALSE(std::filesystem::exists(dir.file("huge")));
}

}  // namespace
