// The `hybridflow` binary as a user runs it: exit codes, output and error messages.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <string>

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

TEST(Cli, InitThenInfoDescribesTheModel) {
  hybridflow::testing::TempDir dir;
  Result init = run("init --preset tiny --task addition --seed 3 --out " + dir.file("m"));
  ASSERT_EQ(init.exit_code, 0) << init.output;
  Result info = run("info " + dir.file("m"));
  ASSERT_EQ(info.exit_code, 0) << info.output;
  EXPECT_NE(info.output.find("LlamaForCausalLM"), std::string::npos) << info.output;
  EXPECT_NE(info.output.find("layers           4"), std::string::npos) << info.output;
}

TEST(Cli, GenerateSamplesReproduciblyWithASeed) {
  hybridflow::testing::TempDir dir;
  ASSERT_EQ(run("init --preset tiny --task addition --out " + dir.file("m")).exit_code, 0);
  std::string args = "generate " + dir.file("m") + " -p 1+2= -p 33+4= --max-new-tokens 5 --seed 7 -n 2";
  Result a = run(args);
  Result b = run(args);
  ASSERT_EQ(a.exit_code, 0) << a.output;
  EXPECT_EQ(a.output, b.output);
  // Two prompts x two samples: four lines, each starting with its prompt.
  EXPECT_EQ(std::count(a.output.begin(), a.output.end(), '\n'), 4) << a.output;
  EXPECT_EQ(a.output.rfind("1+2=", 0), 0u) << a.output;
}

TEST(Cli, UnknownConfigKeyNamesTheClosestValidKey) {
  Result r = run("sft model.path=x optim.weight_decy=0.1");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("optim.weight_decy"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("did you mean 'optim.weight_decay'"), std::string::npos) << r.output;
}

TEST(Cli, MissingModelDirectoryIsAClearError) {
  Result r = run("info /nonexistent/model");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("/nonexistent/model/config.json"), std::string::npos) << r.output;
}

TEST(Cli, UnknownTaskListsTheValidOnes) {
  hybridflow::testing::TempDir dir;
  Result r = run("init --task multiplication --out " + dir.file("m"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("addition"), std::string::npos) << r.output;
}

}  // namespace
