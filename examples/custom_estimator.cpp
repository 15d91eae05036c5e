// A new RL algorithm in your own binary: one advantage function plus one registration, then the
// stock trainer runs it in the estimator program (generate, score, old log-probs, advantages by the
// estimator, update the actor: src/trainer/programs/policy_gradient.cpp), with no program of its own
// (docs/new_algorithm.md walks through it). The estimator here, "grpo_max",
// scores each response against the best response to the same prompt: A = score - max(group score),
// so only the group's best answers are not pushed down.
//   build/example_custom_estimator examples/grpo_addition.yaml algorithm.adv_estimator=grpo_max
// Without arguments it trains a tiny random model for a few steps and prints the scores.
#include <torch/torch.h>

#include <set>
#include <string>
#include <vector>

#include "hybridflow/algo/advantage.h"
#include "hybridflow/runtime/worker_main.h"
#include "hybridflow/trainer/rl_trainer.h"
#include "hybridflow/workers/rl_workers.h"

using namespace hybridflow;

namespace {

algo::AdvantageOutput grpo_max_advantage(const algo::AdvantageInput& in) {
  const auto mask = in.response_mask.to(torch::kFloat);
  const auto scores = (in.token_level_rewards * mask).sum(1);  // one score per response
  auto best = torch::empty_like(scores);
  const auto index = in.index.contiguous();
  for (const int64_t g : std::set<int64_t>(index.data_ptr<int64_t>(), index.data_ptr<int64_t>() + index.numel())) {
    const auto rows = index.eq(g);
    best.masked_fill_(rows, scores.masked_select(rows).max());
  }
  const auto advantages = (scores - best).unsqueeze(1) * mask;
  return {advantages, advantages};
}

}  // namespace

int main(int argc, char** argv) {
  // Workers are this binary re-executed: register what they host, then serve when asked.
  register_rl_workers();
  run_worker_if_requested();
  // The trainer runs on the controller, and only the controller computes advantages.
  algo::register_advantage_estimator("grpo_max", grpo_max_advantage);

  std::string file;
  std::vector<std::string> overrides;
  if (argc > 1) {
    file = argv[1];
    overrides.assign(argv + 2, argv + argc);
  } else {
    overrides = {"algorithm.adv_estimator=grpo_max", "model.hidden_size=32", "model.num_hidden_layers=1",
                 "model.num_attention_heads=2", "model.num_key_value_heads=1", "model.intermediate_size=64",
                 "data.task=addition", "data.max_digits=1", "data.train_size=40", "data.test_size=8",
                 "data.train_batch_size=4", "actor_rollout_ref.rollout.n=4",
                 "actor_rollout_ref.rollout.response_length=2", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                 "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16", "actor_rollout_ref.actor.optim.lr=1e-2",
                 "trainer.total_steps=5"};
  }
  return run_rl_training(load_rl_config(file, overrides));
}
