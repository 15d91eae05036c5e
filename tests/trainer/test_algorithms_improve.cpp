// Every shipped RL example config runs end to end and raises its reward. The starting policy is a
// freshly initialised tiny model, the reward one that policy rarely earns (the response starts with
// '1', about 1 token in 20) from an external command, so the rise can only come from the algorithm.
// Only the model, the reward and the sizes are overridden; estimator, clip, KL and loss settings are
// the example's own.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "hybridflow/runtime/worker_main.h"
#include "hybridflow/trainer/rl_trainer.h"
#include "hybridflow/workers/rl_workers.h"
#include "support/temp_dir.h"

using namespace hybridflow;

static const bool kRanAsWorker = (register_rl_workers(), run_worker_if_requested());

namespace {

struct Case {
  std::string example;  // examples/<example>_addition.yaml
  int64_t prompts;      // data.train_batch_size
  int64_t n;            // rollout.n
  // DAPO keeps only groups whose scores differ, so once nearly every sample earns the reward no batch can be
  // filled (verl stops the same way): its run is shorter.
  int steps = 12;
};

std::vector<double> scores_of_run(const Case& c, const std::string& run_dir, int steps) {
  const std::string scorer =
      "reward.shell=/usr/bin/python3 -c \"import sys,json; [print(1.0 if json.loads(l)['response'].startswith('1') "
      "else 0.0, flush=True) for l in sys.stdin]\"";
  const std::string file = std::string(HF_SOURCE_DIR) + "/examples/" + c.example + "_addition.yaml";
  const int64_t rows = c.prompts * c.n;
  RLTrainer trainer(load_rl_config(
      file, {"model.path=\"\"", "model.hidden_size=32", "model.num_hidden_layers=1", "model.num_attention_heads=2",
             "model.num_key_value_heads=1", "model.intermediate_size=64", "data.train_size=64", "data.test_size=4",
             "data.train_batch_size=" + std::to_string(c.prompts), "actor_rollout_ref.rollout.n=" + std::to_string(c.n),
             "actor_rollout_ref.rollout.response_length=2",
             "actor_rollout_ref.actor.ppo_mini_batch_size=" + std::to_string(c.prompts),
             "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=" + std::to_string(rows),
             "actor_rollout_ref.actor.ppo_epochs=2", "actor_rollout_ref.actor.optim.lr=3e-2",
             "critic.ppo_mini_batch_size=" + std::to_string(c.prompts), "critic.ppo_micro_batch_size_per_gpu=" + std::to_string(rows),
             "critic.optim.lr=1e-2", "reward.type=command", scorer,
             // DAPO: a rare reward leaves most groups uniform at first, so dynamic sampling may need many
             // rounds of 4x the batch; a 2-token budget leaves no room for an overlong buffer, so its penalty is off.
             "data.gen_batch_size=" + std::to_string(4 * c.prompts), "algorithm.filter_groups.max_num_gen_batches=50",
             "reward_model.overlong_buffer.enable=false", "trainer.save_checkpoint=false",
             "trainer.save_freq=0", "trainer.run_dir=" + run_dir, "trainer.total_steps=" + std::to_string(steps)}));
  std::vector<double> scores;
  for (int i = 0; i < steps; ++i) scores.push_back(trainer.step().at("score/mean").get<double>());
  return scores;
}

class AlgorithmImproves : public ::testing::TestWithParam<Case> {};

TEST_P(AlgorithmImproves, RareRewardBecomesCommon) {
  hybridflow::testing::TempDir dir;
  const int steps = GetParam().steps;
  const auto scores = scores_of_run(GetParam(), dir.path(), steps);
  const double first = (scores[0] + scores[1]) / 2;
  const double last = (scores[steps - 2] + scores[steps - 1]) / 2;
  EXPECT_LT(first, 0.3) << "the starting policy must be imperfect for this test to mean anything";
  EXPECT_GT(last, first + 0.3) << GetParam().example << " scores per step: " << ::testing::PrintToString(scores);
}

// Group baselines (grpo, rloo) need several responses per prompt; the others get one each.
INSTANTIATE_TEST_SUITE_P(ShippedExamples, AlgorithmImproves,
                         ::testing::Values(Case{"ppo", 32, 1}, Case{"grpo", 4, 8}, Case{"rloo", 4, 8},
                                           Case{"remax", 32, 1}, Case{"reinforce_pp", 32, 1}, Case{"dr_grpo", 4, 8},
                                           Case{"dapo", 4, 8, 6}, Case{"gspo", 4, 8}),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.example; });

}  // namespace
