// actor_rollout_ref.rollout.batch_invariant: a GRPO run over real worker processes whose rollout records its
// log-probs while decoding with the KV cache (continuous batching, paged cache) and whose actor recomputes
// them in micro-batches of another size: with the mode the rollout/training mismatch metrics are exactly 0 at
// every step, without it they are not.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "hybridflow/runtime/worker_main.h"
#include "hybridflow/trainer/rl_trainer.h"
#include "hybridflow/workers/rl_workers.h"
#include "support/tiny_rl_config.h"

using namespace hybridflow;
using hybridflow::testing::tiny_rl_overrides;

static const bool kRanAsWorker = (register_rl_workers(), run_worker_if_requested());

namespace {

std::vector<nlohmann::json> grpo_steps(bool batch_invariant) {
  // 3 prompts x 3 samples of up to 12 tokens; the old log-probs in micro-batches of 4 rows, so a sequence is
  // recomputed beside other rows than it was decoded with, padded to another width.
  RLTrainer trainer(load_rl_config(
      "", tiny_rl_overrides("grpo", {"model.hidden_size=64", "model.num_attention_heads=4",
                                     "model.num_key_value_heads=2", "model.num_hidden_layers=2",
                                     "data.train_batch_size=3", "actor_rollout_ref.rollout.n=3",
                                     "actor_rollout_ref.actor.ppo_mini_batch_size=3",
                                     "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3",
                                     "actor_rollout_ref.rollout.response_length=12",
                                     "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
                                     "actor_rollout_ref.rollout.max_num_seqs=4",
                                     "actor_rollout_ref.rollout.temperature=0.8", "trainer.total_steps=2",
                                     // The untrained model earns no reward, so GRPO's advantages are 0: the
                                     // entropy bonus gives the actor a gradient, and step 2 new weights.
                                     "actor_rollout_ref.actor.entropy_coeff=0.01",
                                     std::string("actor_rollout_ref.rollout.batch_invariant=") +
                                         (batch_invariant ? "true" : "false")})));
  std::vector<nlohmann::json> steps;
  for (int step = 0; step < 2; ++step) steps.push_back(trainer.step());
  return steps;
}

TEST(RlBatchInvariant, MismatchMetricsAreExactlyZeroWithTheMode) {
  for (const nlohmann::json& m : grpo_steps(true)) {
    for (const char* key : {"rollout_corr/kl", "rollout_corr/k3_kl", "rollout_corr/log_ppl_diff"}) {
      ASSERT_TRUE(m.contains(key)) << key << " missing in " << m.dump();
      EXPECT_EQ(m.at(key).get<double>(), 0.0) << key;
    }
    ASSERT_TRUE(m.contains("actor/grad_norm")) << m.dump();
    EXPECT_GT(m.at("actor/grad_norm").get<double>(), 0.0) << "the step trained the actor";
  }
}

TEST(RlBatchInvariant, MismatchMetricsAreNotZeroWithoutTheMode) {
  double largest = 0;
  for (const nlohmann::json& m : grpo_steps(false)) largest = std::max(largest, m.at("rollout_corr/k3_kl").get<double>());
  EXPECT_GT(largest, 0.0);
}

}  // namespace
