#include "hybridflow/trainer/rollout_sampling.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "hybridflow/core/error.h"
#include "hybridflow/core/fs.h"
#include "support/temp_dir.h"

namespace hybridflow {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kRollout[] = R"(
rollout:
  temperature: null
  top_k: null
  top_p: null
)";

Config rollout(const std::string& overrides = "") {
  return Config::load_from_string(kRollout, overrides, "test.yaml", {}).subtree("rollout");
}

class RolloutSamplingTest : public ::testing::Test {
 protected:
  void write_generation_config(const std::string& json) { write_file_atomic(dir.file("generation_config.json"), json); }
  testing::TempDir dir;
};

// Qwen3's published generation_config.json: its sampling numbers apply unless the config sets its own, and a
// rollout stops at every eos it lists as well as the tokenizer's.
TEST_F(RolloutSamplingTest, GenerationConfigFillsWhatTheConfigLeavesUnset) {
  write_generation_config(R"({"do_sample": true, "eos_token_id": [151645, 151643], "pad_token_id": 151643,
                              "temperature": 0.6, "top_k": 20, "top_p": 0.95})");
  RolloutSampling s = resolve_rollout_sampling(rollout(), dir.path(), 151645);
  EXPECT_EQ(s.temperature, 0.6);
  EXPECT_EQ(s.top_k, 20);
  EXPECT_EQ(s.top_p, 0.95);
  EXPECT_THAT(s.eos_token_ids, ElementsAre(151645, 151643));
  EXPECT_THAT(s.source, HasSubstr("generation_config.json (temperature, top_k, top_p)"));

  s = resolve_rollout_sampling(rollout("rollout: {temperature: 1.0, top_k: -1}"), dir.path(), 7);
  EXPECT_EQ(s.temperature, 1.0);
  EXPECT_EQ(s.top_k, 0);  // verl's -1 = off
  EXPECT_EQ(s.top_p, 0.95);
  EXPECT_THAT(s.eos_token_ids, ElementsAre(151645, 151643, 7));
}

TEST_F(RolloutSamplingTest, WithoutAFileSamplingIsPlain) {
  RolloutSampling s = resolve_rollout_sampling(rollout(), "", 2);
  EXPECT_EQ(s.temperature, 1.0);
  EXPECT_EQ(s.top_k, 0);
  EXPECT_EQ(s.top_p, 1.0);
  EXPECT_THAT(s.eos_token_ids, ElementsAre(2));
  EXPECT_EQ(s.source, "config");
  EXPECT_TRUE(resolve_rollout_sampling(rollout(), dir.path(), -1).eos_token_ids.empty());
}

TEST_F(RolloutSamplingTest, BadValuesNameTheirSource) {
  auto error_of = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_THAT(error_of([&] { resolve_rollout_sampling(rollout("rollout: {top_p: 1.5}"), "", 2); }),
              HasSubstr("actor_rollout_ref.rollout.top_p must be in (0, 1]"));
  EXPECT_THAT(error_of([&] { resolve_rollout_sampling(rollout("rollout: {top_k: -2}"), "", 2); }),
              HasSubstr("actor_rollout_ref.rollout.top_k must be >= 0"));
  write_generation_config(R"({"temperature": 0.0})");
  EXPECT_THAT(error_of([&] { resolve_rollout_sampling(rollout(), dir.path(), 2); }),
              HasSubstr(dir.file("generation_config.json") + ": key 'temperature' must be > 0"));
  write_generation_config(R"({"eos_token_id": "x"})");
  EXPECT_THAT(error_of([&] { resolve_rollout_sampling(rollout(), dir.path(), 2); }), HasSubstr("eos_token_id"));
}

}  // namespace
}  // namespace hybridflow
