// The `hybridflow` binary as a user runs it: exit codes, output and error messages.
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "support/run_command.h"
#include "support/temp_dir.h"
#include "support/tiny_rl_config.h"

namespace {

using hybridflow::testing::CommandResult;
using hybridflow::testing::run_hybridflow;

TEST(Cli, InitThenInfoDescribesTheModel) {
  hybridflow::testing::TempDir dir;
  CommandResult init = run_hybridflow("init --preset tiny --task addition --seed 3 --out " + dir.file("m"));
  ASSERT_EQ(init.exit_code, 0) << init.output;
  CommandResult info = run_hybridflow("info " + dir.file("m"));
  ASSERT_EQ(info.exit_code, 0) << info.output;
  EXPECT_NE(info.output.find("LlamaForCausalLM"), std::string::npos) << info.output;
  EXPECT_NE(info.output.find("layers           4"), std::string::npos) << info.output;
}

TEST(Cli, InfoShowsWhatDistinguishesQwen3AndMistral) {
  hybridflow::testing::TempDir dir;
  ASSERT_EQ(run_hybridflow("init --preset qwen3-tiny --task addition --out " + dir.file("q")).exit_code, 0);
  ASSERT_EQ(run_hybridflow("init --preset mistral-tiny --task addition --out " + dir.file("m")).exit_code, 0);
  CommandResult qwen3 = run_hybridflow("info " + dir.file("q"));
  EXPECT_NE(qwen3.output.find("Qwen3ForCausalLM"), std::string::npos) << qwen3.output;
  EXPECT_NE(qwen3.output.find("(head_dim 48)"), std::string::npos) << qwen3.output;
  EXPECT_NE(qwen3.output.find("q/k head norms   yes"), std::string::npos) << qwen3.output;
  CommandResult mistral = run_hybridflow("info " + dir.file("m"));
  EXPECT_NE(mistral.output.find("MistralForCausalLM"), std::string::npos) << mistral.output;
  EXPECT_NE(mistral.output.find("sliding window   64"), std::string::npos) << mistral.output;
}

TEST(Cli, InfoWithoutAModelDescribesTheBuildAndMachine) {
  CommandResult info = run_hybridflow("info");
  ASSERT_EQ(info.exit_code, 0) << info.output;
  EXPECT_NE(info.output.find("libtorch         2."), std::string::npos) << info.output;
  EXPECT_NE(info.output.find("bf16 matmul"), std::string::npos) << info.output;
  EXPECT_NE(info.output.find("gloo"), std::string::npos) << info.output;
}

TEST(Cli, GenerateSamplesReproduciblyWithASeed) {
  hybridflow::testing::TempDir dir;
  ASSERT_EQ(run_hybridflow("init --preset tiny --task addition --out " + dir.file("m")).exit_code, 0);
  std::string args = "generate " + dir.file("m") + " -p 1+2= -p 33+4= --max-new-tokens 5 --seed 7 -n 2";
  CommandResult a = run_hybridflow(args);
  CommandResult b = run_hybridflow(args);
  ASSERT_EQ(a.exit_code, 0) << a.output;
  EXPECT_EQ(a.output, b.output);
  // Two prompts x two samples: four lines, each starting with its prompt.
  EXPECT_EQ(std::count(a.output.begin(), a.output.end(), '\n'), 4) << a.output;
  EXPECT_EQ(a.output.rfind("1+2=", 0), 0u) << a.output;
}

TEST(Cli, UnknownConfigKeyNamesTheClosestValidKey) {
  CommandResult r = run_hybridflow("sft model.path=x optim.weight_decy=0.1");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("optim.weight_decy"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("did you mean 'optim.weight_decay'"), std::string::npos) << r.output;
}

TEST(Cli, CudaWithoutAGpuIsAClearErrorBeforeAnyWorkerStarts) {
  if (torch::cuda::is_available()) GTEST_SKIP() << "a CUDA device is visible: trainer.device=cuda is valid here";
  CommandResult r = run_hybridflow("train trainer.device=cuda trainer.total_steps=1");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("trainer.device=cuda, but"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("trainer.device=cpu"), std::string::npos) << r.output;
  CommandResult bad = run_hybridflow("train trainer.device=tpu trainer.total_steps=1");
  EXPECT_EQ(bad.exit_code, 1) << bad.output;
  EXPECT_NE(bad.output.find("expected cpu | cuda | auto"), std::string::npos) << bad.output;
}

// Numbers that would make a run exit 0 having done nothing, or fail steps later, fail at start naming the key.
TEST(Cli, InvalidNumbersFailAtStartNamingTheKey) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"trainer.total_steps=-5", "trainer.total_steps must be > 0, got -5"},
      {"actor_rollout_ref.rollout.top_k=-2", "actor_rollout_ref.rollout.top_k must be >= 0"},
      {"actor_rollout_ref.rollout.top_p=0", "actor_rollout_ref.rollout.top_p must be in (0, 1]"},
      {"actor_rollout_ref.rollout.temperature=0", "actor_rollout_ref.rollout.temperature must be > 0"},
      {"actor_rollout_ref.actor.ppo_epochs=0", "actor_rollout_ref.actor.ppo_epochs must be > 0"},
  };
  for (const auto& [override_, message] : cases) {
    CommandResult r = run_hybridflow("train trainer.device=cpu " + override_);
    EXPECT_EQ(r.exit_code, 1) << override_ << "\n" << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << override_ << "\n" << r.output;
  }
}

// verl writes top_k: -1 for "no top-k"; it runs as 0 (off) instead of failing at the first sample.
TEST(Cli, VerlsTopKMinusOneMeansOff) {
  std::string args = "train trainer.device=cpu actor_rollout_ref.rollout.top_k=-1";
  for (const auto& o : hybridflow::testing::tiny_rl_overrides("grpo", {"trainer.total_steps=1"})) args += " " + o;
  CommandResult r = run_hybridflow(args);
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

TEST(Cli, MissingModelDirectoryIsAClearError) {
  CommandResult r = run_hybridflow("info /nonexistent/model");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("/nonexistent/model/config.json"), std::string::npos) << r.output;
}

TEST(Cli, UnknownTaskListsTheValidOnes) {
  hybridflow::testing::TempDir dir;
  CommandResult r = run_hybridflow("init --task multiplication --out " + dir.file("m"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("addition"), std::string::npos) << r.output;
}

}  // namespace
