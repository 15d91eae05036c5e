// How rollouts sample and stop: the config's actor_rollout_ref.rollout keys when set, else the model
// directory's generation_config.json (its temperature / top_k / top_p, as a released model recommends),
// else plain sampling. Resolved once on the controller and handed to the actor's workers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hybridflow/core/config.h"

namespace hybridflow {

struct RolloutSampling {
  double temperature = 1.0;
  int64_t top_k = 0;  // 0 = off
  double top_p = 1.0;
  // generation_config.json's eos ids, then the tokenizer's eos when not among them: a rollout stops at any.
  std::vector<int64_t> eos_token_ids;
  std::string source;  // where the sampling numbers came from, for the log
};

// A config's top_k as generation takes it (0 = off): verl writes -1 for off, transformers 0; below -1 is an
// error naming `key`. For rollout.top_k and rollout.val_kwargs.top_k alike.
int64_t top_k_from_config(int64_t value, const std::string& key);

// `rollout` is the actor_rollout_ref.rollout subtree (null temperature / top_k / top_p = not set).
// `model_dir` may be empty (a preset model) or lack generation_config.json. Errors name the key or file.
RolloutSampling resolve_rollout_sampling(const Config& rollout, const std::string& model_dir, int64_t tokenizer_eos);

}  // namespace hybridflow
