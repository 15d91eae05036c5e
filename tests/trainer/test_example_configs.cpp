// The shipped examples are what users copy first, so every RL example must pass the same schema check
// `hybridflow train` applies, and must select the algorithm its file name promises.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>

#include "hybridflow/algo/algo_config.h"
#include "hybridflow/placement/placement_spec.h"
#include "hybridflow/trainer/rl_program.h"
#include "hybridflow/trainer/rl_trainer.h"
#include "support/error_of.h"

namespace hybridflow {
namespace {

namespace fs = std::filesystem;

const fs::path kExamples = fs::path(HF_SOURCE_DIR) / "examples";

// File-name prefix -> the adv_estimator and the program that file must select.
const std::map<std::string, std::pair<std::string, std::string>> kExpectedEstimator = {
    {"ppo", {"gae", "ppo"}},
    {"grpo", {"grpo", "grpo"}},
    {"grpo_chat", {"grpo", "grpo"}},
    {"grpo_lora", {"grpo", "grpo"}},
    {"grpo_moe_ep2", {"grpo", "grpo"}},
    {"rloo", {"rloo", "rloo"}},
    {"remax", {"remax", "remax"}},
    {"reinforce_pp", {"reinforce_plus_plus", "reinforce_plus_plus"}},
    {"safe_rlhf", {"gae", "safe_rlhf"}},
    {"dr_grpo", {"grpo", "grpo"}},
    {"dapo", {"grpo", "dapo"}},
    {"gspo", {"grpo", "grpo"}},
    {"ppo_colocate", {"gae", "ppo"}},
    {"ppo_split", {"gae", "ppo"}},
    {"ppo_standalone", {"gae", "ppo"}},
    {"ppo_pools", {"gae", "ppo"}},
};

// The placement examples: the pools each one starts (name:processes) and its staleness.
const std::map<std::string, std::pair<std::vector<std::string>, int>> kExpectedPlacement = {
    {"ppo_colocate", {{"global:1"}, 0}},
    {"ppo_split", {{"actor:1", "critic:1"}, 0}},
    {"ppo_standalone", {{"train:1", "rollout:1"}, 1}},
    {"ppo_pools", {{"learner:1", "gen:1", "values:1"}, 0}},
};

TEST(ExampleConfigs, EveryRLExampleLoadsAndSelectsItsAlgorithm) {
  for (const auto& [prefix, expected] : kExpectedEstimator) {
    const std::string& estimator = expected.first;
    const fs::path file = kExamples / (prefix + "_addition.yaml");
    SCOPED_TRACE(file.string());
    ASSERT_TRUE(fs::exists(file));
    const Config config = load_rl_config(file.string(), {});
    EXPECT_EQ(algo::advantage_estimator_name(config.subtree("algorithm")), estimator);
    EXPECT_EQ(rl_program_name(config), expected.second);
    EXPECT_EQ(config.get<std::string>("data.task"), "addition");
    const int64_t n = config.get<int64_t>("actor_rollout_ref.rollout.n");
    // Group baselines compare responses to the same prompt, so they need more than one.
    if (estimator == "grpo" || estimator == "rloo") {
      EXPECT_GE(n, 2);
    }
    if (prefix == "grpo_moe_ep2") {
      // The expert-parallel example trains a mixture-of-experts preset from scratch (no MoE model ships).
      EXPECT_EQ(config.get<std::string>("model.preset"), "qwen3-moe-tiny");
      EXPECT_EQ(config.get<int>("actor_rollout_ref.actor.megatron.expert_model_parallel_size"), 2);
    } else {
      EXPECT_FALSE(config.get<std::string>("model.path").empty());
    }
  }
}

TEST(ExampleConfigs, EveryPlacementExampleResolvesToItsPools) {
  for (const auto& [prefix, expected] : kExpectedPlacement) {
    const fs::path file = kExamples / (prefix + "_addition.yaml");
    SCOPED_TRACE(file.string());
    const RolePlacement placement = resolve_placement(load_rl_config(file.string(), {}), {"actor", "critic"});
    std::vector<std::string> pools;
    for (const auto& pool : placement.pools) pools.push_back(pool.name + ":" + std::to_string(pool.processes));
    EXPECT_EQ(pools, expected.first);
    EXPECT_EQ(placement.staleness, expected.second);
  }
}

TEST(ExampleConfigs, NoAdditionExampleIsLeftUnchecked) {
  for (const auto& entry : fs::directory_iterator(kExamples)) {
    const std::string name = entry.path().filename().string();
    const std::string suffix = "_addition.yaml";
    if (name.size() <= suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
      continue;
    const std::string prefix = name.substr(0, name.size() - suffix.size());
    // Not RL configs: hybridflow sft / rm / dpo (tests/apps runs each of those).
    if (prefix == "sft" || prefix == "sft_chat" || prefix == "rm" || prefix == "dpo") continue;
    EXPECT_TRUE(kExpectedEstimator.count(prefix)) << name << " has no expected estimator in this test";
  }
}

TEST(ExampleConfigs, SftExampleIsRejectedAsAnRLConfig) {
  const std::string file = (kExamples / "sft_addition.yaml").string();
  const std::string message = testing::error_of([&] { load_rl_config(file, {}); });
  // The SFT file's top-level `optim` section has no place in the RL schema; the error must say which key.
  EXPECT_NE(message.find("optim"), std::string::npos) << message;
}

}  // namespace
}  // namespace hybridflow
