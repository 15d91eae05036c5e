// What the RL trainer's model-parallel tests share: a reward model directory and PPO with critic, reference
// and reward model on 4 colocated processes, whose layouts the tests vary and compare with the
// all-data-parallel run of the same seed.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "hybridflow/model/pretrained.h"
#include "hybridflow/tasks/task.h"
#include "hybridflow/workers/model_spec.h"
#include "support/tiny_rl_config.h"

namespace hybridflow::testing {

// A value-head model directory for the reward model: the tiny run's shape and tokenizer, fixed weights.
inline std::string write_reward_model(const std::string& dir, int layers = 1) {
  TaskOptions options;
  const Tokenizer tokenizer = Tokenizer::from_alphabet(make_task("addition", options)->alphabet());
  nlohmann::json spec = {{"preset", "tiny"},         {"vocab_size", tokenizer.vocab_size()},
                         {"hidden_size", 32},        {"num_hidden_layers", layers},
                         {"num_attention_heads", 2}, {"num_key_value_heads", 1},
                         {"intermediate_size", 64},  {"init_seed", 77},
                         {"eos_token_id", tokenizer.eos_id()}, {"pad_token_id", tokenizer.pad_id()}};
  save_pretrained(dir, build_model(spec.get<ModelSpec>(), HeadKind::kValue), tokenizer);
  return dir;
}

// PPO with critic, reference (KL loss) and reward model on 4 colocated processes, 4 prompts x 2 samples;
// every role split over tp tensor-parallel ranks, the actor generating with gen_tp.
inline std::vector<std::string> ppo_on_four(const std::string& rm_dir, int tp, int gen_tp,
                                            std::vector<std::string> extra = {}) {
  const std::string t = std::to_string(tp);
  std::vector<std::string> o = {"actor_rollout_ref.num_processes=4",
                                "trainer.placement=colocate",
                                "data.train_batch_size=4",
                                "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
                                "critic.ppo_mini_batch_size=4",
                                "critic.ppo_micro_batch_size_per_gpu=2",
                                // In order, the 2-row micro-batches are the same rows at dp 2 and dp 4, so the
                                // per-micro-batch metrics average over the same groups.
                                "actor_rollout_ref.actor.shuffle=false",
                                "critic.shuffle=false",
                                // Balanced ranks would reorder the rows by each layout's data-parallel size.
                                "trainer.balance_batch=false",
                                "actor_rollout_ref.actor.use_kl_loss=true",
                                "reward_model.enable=true",
                                "reward_model.path=" + rm_dir,
                                "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=" + t,
                                "actor_rollout_ref.rollout.tensor_model_parallel_size=" + std::to_string(gen_tp),
                                "critic.megatron.tensor_model_parallel_size=" + t,
                                "reward_model.megatron.tensor_model_parallel_size=" + t};
  o.insert(o.end(), extra.begin(), extra.end());
  return tiny_rl_overrides("gae", o);
}

inline double metric(const nlohmann::json& record, const std::string& key) {
  EXPECT_TRUE(record.contains(key)) << key << " missing from " << record.dump();
  return record.contains(key) ? record.at(key).get<double>() : 0.0;
}

// A step's metrics agree with the same step of a run in another layout: the same tokens (scores and lengths
// within 1e-5; the reward model's when the run has one), losses, entropy, values and gradient norms within
// 1e-4.
inline void expect_follows(const nlohmann::json& got, const nlohmann::json& want, const std::string& what) {
  std::vector<std::string> same_tokens = {"score/rule_mean", "response_length/mean"};
  if (want.contains("score/rm_mean")) same_tokens.push_back("score/rm_mean");
  for (const std::string& key : same_tokens) EXPECT_NEAR(metric(got, key), metric(want, key), 1e-5) << key << " " << what;
  for (const char* key : {"actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm", "critic/vpred_mean",
                          "critic/vf_loss", "critic/grad_norm"})
    EXPECT_NEAR(metric(got, key), metric(want, key), 1e-4 + 1e-4 * std::abs(metric(want, key))) << key << " " << what;
}

}  // namespace hybridflow::testing
