// A new RL algorithm as a program in your own binary: one function that calls the worker groups by name,
// plus one registration (docs/new_algorithm.md walks through it). The program here, "best_of_n", is
// RAFT-style rejection sampling: of each prompt's rollout.n samples only the best-scored one is pushed up
// (advantage 1 on its tokens, 0 elsewhere), with PPO's clipped ratio against the rollout policy.
//   build/example_custom_program examples/grpo_addition.yaml algorithm.program=best_of_n
// Without arguments it trains a tiny random model for a few steps and prints the scores.
#include <torch/torch.h>

#include <string>
#include <vector>

#include "hybridflow/core/error.h"
#include "hybridflow/runtime/worker_main.h"
#include "hybridflow/trainer/rl_program.h"
#include "hybridflow/trainer/rl_trainer.h"
#include "hybridflow/workers/rl_workers.h"

using namespace hybridflow;

namespace {

nlohmann::json best_of_n(RLStep& step) {
  auto& [actor, ref, critic, reward, cost, cost_critic] = step.roles();
  RolloutBatch batch = actor.generate_sequences(step.next_prompts());
  Pending scores = reward.compute_reward(batch);           // rule reward (+ reward model)
  Pending old_log_prob = actor.compute_log_prob(batch);    // dispatched beside it
  Pending ref_log_prob = ref ? ref->compute_log_prob(batch) : Pending();  // with a KL loss
  join(scores, old_log_prob, ref_log_prob);
  const algo::AdvantageInput in = step.advantage_input(batch);
  // Rows of one prompt are consecutive: view the scores as [prompts, n] and mark each row's best sample.
  const auto by_prompt = batch.scores().view({-1, batch.n()});
  const auto best = torch::zeros_like(by_prompt).scatter_(1, by_prompt.argmax(1, /*keepdim=*/true), 1.0);
  const auto advantages = best.view({-1, 1}) * in.response_mask;
  batch.set_advantages({advantages, advantages});
  actor.update_actor(batch).join();
  return step.finish(batch);
}

}  // namespace

int main(int argc, char** argv) {
  // Workers are this binary re-executed: register what they host, then serve when asked.
  register_rl_workers();
  run_worker_if_requested();
  // Programs run on the controller only. The check runs when the trainer is built, before any worker starts.
  register_rl_program("best_of_n", best_of_n, [](const Config& config) {
    HF_CHECK(config.get<int64_t>("actor_rollout_ref.rollout.n") > 1,
             "actor_rollout_ref.rollout.n: best_of_n picks the best of several samples per prompt; set it above 1");
  });

  std::string file;
  std::vector<std::string> overrides;
  if (argc > 1) {
    file = argv[1];
    overrides.assign(argv + 2, argv + argc);
  } else {
    overrides = {"algorithm.program=best_of_n", "algorithm.adv_estimator=grpo", "model.hidden_size=32",
                 "model.num_hidden_layers=1", "model.num_attention_heads=2", "model.num_key_value_heads=1",
                 "model.intermediate_size=64", "data.task=addition", "data.max_digits=1", "data.train_size=40",
                 "data.test_size=8", "data.train_batch_size=4", "actor_rollout_ref.rollout.n=4",
                 "actor_rollout_ref.rollout.response_length=2", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                 "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16", "actor_rollout_ref.actor.optim.lr=1e-2",
                 "trainer.total_steps=5"};
  }
  return run_rl_training(load_rl_config(file, overrides));
}
