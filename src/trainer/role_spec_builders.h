// Internal to trainer/: each role's spec (workers/role_specs.h) and its worker group's layout, built once
// from the configuration. Every check and every default of a role's keys is here, and nowhere else: the
// workers decode the specs and read no key, and the trainer's steps use the specs' fields.
//
// Each builder reads through a ConfigReader, so the keys each role consumes are noted under the role's
// name (RoleSpecKeys); tests/trainer/test_role_spec_keys.cpp holds them against docs/configuration.md.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>

#include "config_reader.h"
#include "rl_batch_sizes.h"
#include "hybridflow/engine/prompt_encoder.h"
#include "hybridflow/runtime/mesh_coord.h"
#include "hybridflow/trainer/rollout_sampling.h"
#include "hybridflow/workers/role_specs.h"

namespace hybridflow {

// Spec name (model, rollout, actor, ref, critic, reward_model, cost_model) -> the dotted keys it read.
using RoleSpecKeys = std::map<std::string, std::set<std::string>>;

// What the specs depend on besides their own keys: what the trainer decided before them.
struct RoleFacts {
  uint64_t seed = 0;          // trainer.seed: sampling's and the actor's data order (critic +1, cost critic +2)
  int64_t total_steps = 1;    // trainer.total_steps: an LR schedule's length unless its own is set
  int64_t batch_prompts = 1;  // data.train_batch_size
  std::string adv_estimator;  // algorithm.adv_estimator
  bool need_critic = false, need_cost_critic = false, need_reward_model = false, need_cost_model = false;
  // Whether the algorithm puts the KL into the reward (algorithm.use_kl_in_reward): then the reference runs.
  bool kl_in_reward = false;
  // Processes of a role's pool and the key that sets them, from the placement (unused for a role that
  // does not run).
  struct Pool {
    int processes = 1;
    std::string key;
  };
  Pool actor, rollout, critic, cost_critic, reward_model, cost_model;
  bool standalone_rollout = false;  // generation on a pool of its own (placement standalone)
  // The prompt encoder's chat template settings (data.apply_chat_template_kwargs, custom_chat_template), which a
  // multi-turn rollout renders its conversations with too.
  PromptOptions prompts;
};

// A role's spec with what its worker group is created with besides.
template <typename Spec>
struct RolePlan {
  Spec spec;
  ModelSpec model;  // the role's model: the trainer's with the role's dtype and path
  ParallelLayout layout;
  int dp = 1;  // data-parallel groups
};

struct RoleSpecs {
  RolloutSampling sampling;  // where the rollout's sampling numbers came from, for the log
  std::string response_length_key;  // the key that set rollout.response_length, for errors
  RolePlan<ActorSpec> actor;
  // As the actor's processes generate (with a standalone pool: unused, in the actor's layout and dtype).
  RolloutSpec rollout;
  std::optional<RolePlan<RolloutSpec>> standalone_rollout;  // the standalone rollout pool's
  std::optional<RefSpec> ref;                               // when the reference runs
  std::optional<RolePlan<CriticSpec>> critic, cost_critic;
  std::optional<RolePlan<ScoringModelSpec>> reward_model, cost_model;
};

// The model every role starts from (model.*): path or preset and its dimensions, and the init seed. The
// trainer adds the tokenizer's ids and the device.
ModelSpec model_spec_from_config(const ConfigReader& c);

// actor_rollout_ref.rollout.multi_turn as RolloutSpec::multi_turn: null when enable is false, else the
// checked values an AgentRolloutRuntime loads (tokenizer_dir is `model_dir`, whose chat template renders the
// conversations). Refused: an empty model_dir, and generation under pipeline and tensor parallelism together.
nlohmann::json multi_turn_rollout_spec(const ConfigReader& multi_turn, const std::string& model_dir,
                                       int64_t response_length, int generation_pp, int generation_tp,
                                       const PromptOptions& prompts = {});

// Every role's spec. `model` is the model spec every role starts from, with the tokenizer's ids
// (eos_token_id, pad_token_id, vocab_size); the rollout's sampling (trainer/rollout_sampling.h) adds the
// ids a rollout stops at. `keys` (may be null) gets the keys each spec read.
RoleSpecs build_role_specs(const Config& config, const RoleFacts& facts, const ModelSpec& model,
                           RoleSpecKeys* keys = nullptr);

}  // namespace hybridflow
