// Partial rollouts (actor_rollout_ref.rollout.partial_rollout) over real worker processes: a standalone
// rollout's generations in flight at a weight sync take the new weights between two tokens and go on.
// On-policy nothing is in flight at a sync, so the run is the one without them, number for number; with
// staleness k every response token records the version that drew it, at most k updates before the policy
// that trains on it, and the rollout correction weighs each token by the policy that sampled it.
#include <gtest/gtest.h>

#include "hybridflow/core/jsonl.h"
#include "hybridflow/runtime/worker_main.h"
#include "hybridflow/trainer/rl_trainer.h"
#include "hybridflow/workers/rl_workers.h"
#include "support/error_of.h"
#include "support/temp_dir.h"
#include "support/tiny_rl_config.h"

using namespace hybridflow;

static const bool kRanAsWorker = (register_rl_workers(), run_worker_if_requested());

namespace {

constexpr int kPartialSteps = 6;

struct PartialRun {
  std::vector<nlohmann::json> metrics;
  double actor_norm = 0, rollout_norm = 0;
};

PartialRun train_standalone(const std::vector<std::string>& extra_options) {
  hybridflow::testing::TempDir dir;
  std::vector<std::string> extra = {"trainer.placement=standalone",
                                    "trainer.total_steps=" + std::to_string(kPartialSteps),
                                    "trainer.run_dir=" + dir.path(),
                                    "trainer.log_samples_freq=0",
                                    "data.train_batch_size=4",
                                    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                                    "actor_rollout_ref.actor.optim.lr=2e-2"};
  extra.insert(extra.end(), extra_options.begin(), extra_options.end());
  RLTrainer trainer(load_rl_config("", hybridflow::testing::tiny_rl_overrides("grpo", extra)));
  trainer.fit();
  PartialRun run;
  run.metrics = read_jsonl(dir.path() + "/metrics.jsonl");
  run.actor_norm = trainer.parameter_sq_norm("actor");
  run.rollout_norm = trainer.parameter_sq_norm("rollout");
  return run;
}

// What a partial rollout may change without changing a token: the clock's figures and the bytes moved.
bool clock_dependent(const std::string& key) {
  const bool seconds = key.size() > 2 && key.compare(key.size() - 2, 2, "_s") == 0;
  // perf/*_bytes: the per-token versions travel with the batch.
  return seconds || key.rfind("timing/", 0) == 0 || key.rfind("perf/throughput", 0) == 0 ||
         key.rfind("memory/", 0) == 0 || key.rfind("weight_sync/", 0) == 0 || key == "perf/controller_bytes" ||
         key == "perf/worker_to_worker_bytes";
}

TEST(PartialRollout, OnPolicyRunIsTheRunWithoutPartialRollouts) {
  const PartialRun off = train_standalone({});
  const PartialRun on = train_standalone({"actor_rollout_ref.rollout.partial_rollout=true"});
  ASSERT_EQ(on.metrics.size(), off.metrics.size());
  ASSERT_EQ(on.metrics.size(), static_cast<size_t>(kPartialSteps));
  for (size_t i = 0; i < off.metrics.size(); ++i) {
    size_t compared = 0;
    for (const auto& [key, value] : off.metrics[i].items()) {
      if (clock_dependent(key)) continue;
      ASSERT_TRUE(on.metrics[i].contains(key)) << "step " << i + 1 << " lacks " << key;
      EXPECT_EQ(on.metrics[i].at(key), value) << "step " << i + 1 << ": " << key;
      ++compared;
    }
    EXPECT_GT(compared, 15u);
    // Every token of an on-policy rollout is of the policy that trains on it.
    EXPECT_EQ(on.metrics[i].at("rollout/token_staleness_max").get<double>(), 0) << "step " << i + 1;
    EXPECT_EQ(on.metrics[i].at("rollout/stale_token_fraction").get<double>(), 0) << "step " << i + 1;
    EXPECT_EQ(on.metrics[i].at("rollout/resumed_sequences").get<double>(), 0) << "step " << i + 1;
    EXPECT_FALSE(off.metrics[i].contains("rollout/token_staleness_max"));
  }
  EXPECT_EQ(on.actor_norm, off.actor_norm);
  EXPECT_EQ(on.rollout_norm, off.rollout_norm);
}

// Staleness 2 with long responses decoded two at a time: the rollout pool is busy whenever a sync comes,
// so some sequences change weights mid-generation. No token is more than 2 updates old, none older than the
// version that began its sequence, and the correction's weights are computed per token.
TEST(PartialRollout, StalenessTwoRecordsEachTokensVersionWithinTheBound) {
  const PartialRun run = train_standalone({"actor_rollout_ref.rollout.staleness=2",
                                           "actor_rollout_ref.rollout.partial_rollout=true",
                                           "actor_rollout_ref.rollout.response_length=96",
                                           "actor_rollout_ref.rollout.max_num_seqs=2",
                                           "algorithm.rollout_correction.rollout_is=token"});
  ASSERT_EQ(run.metrics.size(), static_cast<size_t>(kPartialSteps));
  double resumed = 0;
  for (int i = 0; i < kPartialSteps; ++i) {
    const auto& m = run.metrics[i];
    const double token_max = m.at("rollout/token_staleness_max").get<double>();
    const double token_mean = m.at("rollout/token_staleness_mean").get<double>();
    EXPECT_LE(token_max, 2) << "step " << i + 1;
    EXPECT_LE(token_max, m.at("rollout/staleness_max").get<double>()) << "step " << i + 1;
    EXPECT_LE(token_mean, token_max) << "step " << i + 1;
    EXPECT_GE(m.at("rollout/stale_token_fraction").get<double>(), 0) << "step " << i + 1;
    EXPECT_LE(m.at("rollout/stale_token_fraction").get<double>(), 1) << "step " << i + 1;
    EXPECT_TRUE(m.contains("rollout_corr/rollout_is_mean")) << "step " << i + 1;
    resumed += m.at("rollout/resumed_sequences").get<double>();
  }
  EXPECT_EQ(run.metrics[0].at("rollout/token_staleness_max").get<double>(), 0);
  EXPECT_GT(resumed, 0) << "no generation was in flight at any of the weight syncs";
  // The rollout holds the actor's last weights: the syncs, early or not, all arrived.
  EXPECT_EQ(run.rollout_norm, run.actor_norm);
}

TEST(PartialRollout, NeedsAStandaloneRollout) {
  hybridflow::testing::TempDir dir;
  const std::string message = hybridflow::testing::error_of([&] {
    RLTrainer trainer(load_rl_config("", hybridflow::testing::tiny_rl_overrides(
                                             "grpo", {"trainer.run_dir=" + dir.path(),
                                                      "actor_rollout_ref.rollout.partial_rollout=true"})));
  });
  EXPECT_NE(message.find("partial_rollout = true needs a standalone rollout"), std::string::npos) << message;
}

}  // namespace
