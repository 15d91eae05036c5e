// The smallest RL run the trainer tests share: a 1-layer model on the addition task, 2 prompts with 2
// responses of 4 tokens per step, so a step over real worker processes takes well under a second.
// Overrides apply in order, so a test's `extra` replaces any of these.
#pragma once

#include <string>
#include <vector>

namespace hybridflow::testing {

// The 1-layer model of these runs, as the trainer's model.* overrides.
inline std::vector<std::string> tiny_rl_model_overrides() {
  return {"model.hidden_size=32", "model.num_hidden_layers=1", "model.num_attention_heads=2",
          "model.num_key_value_heads=1", "model.intermediate_size=64"};
}

// The same model on a command line: the overrides separated by spaces.
inline std::string tiny_rl_model_args() {
  std::string args;
  for (const std::string& o : tiny_rl_model_overrides()) args += (args.empty() ? "" : " ") + o;
  return args;
}

inline std::vector<std::string> tiny_rl_overrides(const std::string& estimator,
                                                  const std::vector<std::string>& extra = {}) {
  std::vector<std::string> o = {"algorithm.adv_estimator=" + estimator,
                                "data.task=addition",
                                "data.train_size=16",
                                "data.test_size=4",
                                "data.train_batch_size=2",
                                "actor_rollout_ref.rollout.n=2",
                                "actor_rollout_ref.rollout.response_length=4",
                                "actor_rollout_ref.actor.ppo_mini_batch_size=2",
                                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
                                "actor_rollout_ref.actor.optim.lr=1e-3",
                                "critic.ppo_mini_batch_size=2",
                                "critic.optim.lr=1e-3",
                                "trainer.total_steps=2"};
  const std::vector<std::string> model = tiny_rl_model_overrides();
  o.insert(o.begin() + 1, model.begin(), model.end());
  o.insert(o.end(), extra.begin(), extra.end());
  return o;
}

// What the mixture-of-experts trainer tests append to their overrides: a command reward that differs between
// samples (the response's digit count / 4), `steps` steps without a samples log in run_dir, then `more`.
inline void append_digit_reward_run(std::vector<std::string>& o, int steps, const std::string& run_dir,
                                    const std::vector<std::string>& more) {
  o.insert(o.end(), {"reward.type=command",
                     "reward.shell=/usr/bin/python3 -c \"import sys,json; [print(sum(c.isdigit() for c in "
                     "json.loads(l)['response']) / 4.0, flush=True) for l in sys.stdin]\"",
                     "trainer.total_steps=" + std::to_string(steps), "trainer.log_samples_freq=0",
                     "trainer.run_dir=" + run_dir});
  o.insert(o.end(), more.begin(), more.end());
}

}  // namespace hybridflow::testing
