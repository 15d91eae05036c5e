// Every configuration key has one reader. The role specs (trainer/role_spec_builders.h) and the run's spec
// (trainer/run_spec_builders.h) note the keys they read; held against the `hybridflow train` reference in
// docs/configuration.md, a documented key that nothing reads, a key that two specs read, or a key read but
// not documented fails here, naming it.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include "hybridflow/core/error.h"
#include "hybridflow/trainer/rl_trainer.h"
#include "support/error_of.h"
#include "trainer/role_spec_builders.h"
#include "trainer/run_spec_builders.h"

namespace hybridflow {
namespace {

// Documented keys that no spec reads, and who reads them instead. Everything else of the `hybridflow train`
// reference is read by exactly one spec: a role's (role_spec_builders.h), a part of the run's
// (run_spec_builders.h: trainer, data, algorithm, scoring, the scorers' sections included) or verl's
// derivations in load_rl_config (verl_derived.cpp: verl's own keys only).
const std::map<std::string, std::string> kReadElsewhere = {
    {"actor_rollout_ref.num_processes", "placement (placement_spec.cpp)"},
    {"actor_rollout_ref.rollout.num_processes", "placement (placement_spec.cpp)"},
    {"actor_rollout_ref.rollout.staleness", "placement (placement_spec.cpp)"},
    {"actor_rollout_ref.rollout.trigger_parameter_sync_step", "placement (placement_spec.cpp)"},
    {"critic.num_processes", "placement (placement_spec.cpp)"},
    {"reward_model.num_processes", "placement (placement_spec.cpp)"},
    {"cost_model.num_processes", "placement (placement_spec.cpp)"},
    {"trainer.placement", "placement (placement_spec.cpp)"},
    {"trainer.colocate", "placement (placement_spec.cpp)"},
    {"pools", "placement (placement_spec.cpp)"},
    {"data.max_prompt_length", "the prompt encoder (PromptOptions::from_config)"},
    {"data.truncation", "the prompt encoder (PromptOptions::from_config)"},
    {"data.filter_overlong_prompts", "the prompt encoder (PromptOptions::from_config)"},
    {"data.apply_chat_template", "the prompt encoder (PromptOptions::from_config)"},
    {"data.add_bos", "the prompt encoder (PromptOptions::from_config)"},
    {"data.apply_chat_template_kwargs", "the prompt encoder (PromptOptions::from_config)"},
    {"actor_rollout_ref.model.custom_chat_template", "the prompt encoder (PromptOptions::from_config)"},
};

void flatten(const YAML::Node& node, const std::string& prefix, std::set<std::string>* out) {
  if (node.IsMap() && node.size() > 0) {
    for (const auto& kv : node) {
      const std::string key = kv.first.as<std::string>();
      flatten(kv.second, prefix.empty() ? key : prefix + "." + key, out);
    }
  } else {
    out->insert(prefix);
  }
}

// The dotted keys of the `hybridflow train` YAML block of docs/configuration.md.
std::set<std::string> documented_train_keys() {
  const std::string path = std::string(HF_SOURCE_DIR) + "/docs/configuration.md";
  std::ifstream in(path);
  EXPECT_TRUE(in) << path;
  std::stringstream text;
  text << in.rdbuf();
  const std::string doc = text.str();
  const size_t at = doc.find("## `hybridflow train`");
  const size_t open = doc.find("```yaml\n", at);
  const size_t close = doc.find("```", open + 8);
  EXPECT_TRUE(at != std::string::npos && open != std::string::npos && close != std::string::npos) << path;
  std::set<std::string> keys;
  flatten(YAML::Load(doc.substr(open + 8, close - open - 8)), "", &keys);
  return keys;
}

// Every role running, each on a pool of one process: every spec builder runs and reads all its keys.
RoleSpecs all_roles(const Config& config, RoleSpecKeys* keys) {
  RoleFacts f;
  f.seed = 1;
  f.total_steps = 10;
  f.batch_prompts = 8;
  f.adv_estimator = "gae";
  f.need_critic = f.need_cost_critic = f.need_reward_model = f.need_cost_model = true;
  f.kl_in_reward = true;
  for (const auto& [pool, key] : std::initializer_list<std::pair<RoleFacts::Pool*, const char*>>{
           {&f.actor, "actor_rollout_ref.num_processes"}, {&f.rollout, "actor_rollout_ref.rollout.num_processes"},
           {&f.critic, "critic.num_processes"}, {&f.cost_critic, "critic.num_processes"},
           {&f.reward_model, "reward_model.num_processes"}, {&f.cost_model, "cost_model.num_processes"}})
    pool->key = key;
  ModelSpec model = model_spec_from_config(ConfigReader(config, &(*keys)["model"]));
  model.vocab_size = 16;
  model.eos_token_id = 2;
  model.pad_token_id = 0;
  return build_role_specs(config, f, model, keys);
}

TEST(RoleSpecKeys, EveryDocumentedKeyHasExactlyOneReader) {
  // A cost configured, so that Safe-RLHF's keys are read too.
  const Config config = load_rl_config("", {"cost.type=contains", "cost.contains=[x]"});
  RoleSpecKeys keys;
  all_roles(config, &keys);
  build_run_spec(config, &keys);
  // verl's derivations, each taken: total_epochs (with the data keys it needs) and n_gpus_per_node x nnodes.
  verl_derived_overrides(
      load_rl_config("", {"trainer.total_epochs=1", "trainer.n_gpus_per_node=1", "trainer.nnodes=1"}), &keys);
  std::map<std::string, std::vector<std::string>> readers;  // key -> the specs that read it
  for (const auto& [spec, read] : keys)
    for (const std::string& key : read) readers[key].push_back(spec);
  for (const auto& [key, elsewhere] : kReadElsewhere) {
    EXPECT_FALSE(readers.count(key)) << key << " is read by " << elsewhere << " and by the " << readers[key].front()
                                     << " spec";
    readers[key].push_back(elsewhere);
  }
  const std::set<std::string> documented = documented_train_keys();
  for (const std::string& key : documented) {
    const auto it = readers.find(key);
    if (it == readers.end()) {
      ADD_FAILURE() << "docs/configuration.md documents " << key << ", which no spec (nor any reader listed "
                    << "here) reads";
      continue;
    }
    std::string names;
    for (const std::string& name : it->second) names += " " + name;
    EXPECT_EQ(it->second.size(), 1u) << key << " is read by more than one spec:" << names;
  }
  for (const auto& [key, specs] : readers)
    EXPECT_TRUE(documented.count(key)) << "the " << specs.front() << " spec reads " << key
                                       << ", which docs/configuration.md does not document";
  // Each spec reads its own section (and the rollout the response budget's fallback).
  EXPECT_TRUE(keys["rollout"].count("actor_rollout_ref.rollout.n"));
  EXPECT_TRUE(keys["rollout"].count("data.max_response_length"));
  EXPECT_TRUE(keys["actor"].count("actor_rollout_ref.actor.optim.lr"));
  EXPECT_TRUE(keys["critic"].count("critic.optim.lr"));
  EXPECT_TRUE(keys["cost_model"].count("cost_model.micro_batch_size_per_gpu"));
  EXPECT_TRUE(keys["trainer"].count("trainer.seed"));
  EXPECT_TRUE(keys["data"].count("data.gen_batch_size"));
  EXPECT_TRUE(keys["algorithm"].count("algorithm.safe_rlhf.lambda_max"));
  EXPECT_TRUE(keys["scoring"].count("reward_model.overlong_buffer.len"));
  EXPECT_TRUE(keys["scoring"].count("reward.url"));
  EXPECT_TRUE(keys["scoring"].count("cost.max_output_bytes"));
  EXPECT_TRUE(keys["verl"].count("trainer.total_epochs"));
}

// The run spec holds what the configuration says, with its checks and defaults in one place.
TEST(RunSpecKeys, TheRunSpecHoldsTheConfiguredValues) {
  const RunSpec spec = build_run_spec(load_rl_config(
      "", {"trainer.seed=7", "data.train_batch_size=6", "algorithm.adv_estimator=grpo",
           "algorithm.filter_groups.enable=true", "algorithm.filter_groups.max_num_gen_batches=3",
           "reward_model.reward_clip=[-2,3]", "reward_model.overlong_buffer.enable=true",
           "reward_model.overlong_buffer.len=4", "algorithm.kl_ctrl.kl_coef=0.05"}));
  EXPECT_EQ(spec.trainer.seed, 7u);
  EXPECT_EQ(spec.data.train_batch_size, 6);
  EXPECT_EQ(spec.data.gen_batch_size, 6);  // null: the training batch
  EXPECT_EQ(spec.algorithm.program, "dapo");
  EXPECT_EQ(spec.algorithm.filter_groups.max_num_gen_batches, 3);
  EXPECT_FALSE(spec.algorithm.safe_rlhf.has_value());  // no cost configured
  EXPECT_DOUBLE_EQ(spec.algorithm.kl_ctrl.controller().value(), 0.05);
  ASSERT_TRUE(spec.scoring.reward_clip.has_value());
  EXPECT_EQ(*spec.scoring.reward_clip, std::make_pair(-2.0, 3.0));
  EXPECT_TRUE(spec.scoring.overlong_buffer.enable);
  EXPECT_EQ(spec.scoring.overlong_buffer.len, 4);
}

// The command / HTTP scorers' keys arrive typed in the scoring spec, which make_reward_function takes.
TEST(RunSpecKeys, TheScorersSectionsAreTypedInTheScoringSpec) {
  const ScoringSpec scoring =
      build_run_spec(load_rl_config("", {"reward.type=command", "reward.shell=cat", "reward.timeout_s=5",
                                         "reward.max_output_bytes=100", "cost.type=http",
                                         "cost.url=http://127.0.0.1:9/cost", "cost.allowed_hosts=[scores.lan]"}))
          .scoring;
  ASSERT_TRUE(scoring.reward_function.has_value());
  const RewardFunctionSpec& reward = *scoring.reward_function;
  EXPECT_EQ(reward.section, "reward");
  EXPECT_EQ(reward.type, "command");
  EXPECT_EQ(reward.shell.value_or(""), "cat");
  EXPECT_FALSE(reward.command.has_value());
  EXPECT_DOUBLE_EQ(reward.timeout_s, 5.0);
  EXPECT_EQ(reward.max_output_bytes, 100);
  ASSERT_TRUE(scoring.cost_function.has_value());
  const RewardFunctionSpec& cost = *scoring.cost_function;
  EXPECT_EQ(cost.section, "cost");
  EXPECT_EQ(cost.url.value_or(""), "http://127.0.0.1:9/cost");
  EXPECT_EQ(cost.allowed_hosts, std::vector<std::string>{"scores.lan"});
  EXPECT_DOUBLE_EQ(cost.timeout_s, 60.0);  // the schema's default
  EXPECT_EQ(cost.max_output_bytes, kDefaultRewardMaxOutputBytes);
  // reward.type task scores with data.task's own rule unless reward.task names another task.
  EXPECT_FALSE(build_run_spec(load_rl_config("", {})).scoring.reward_function.has_value());
  EXPECT_FALSE(build_run_spec(load_rl_config("", {})).scoring.cost_function.has_value());
  const auto named = build_run_spec(load_rl_config("", {"reward.task=addition"})).scoring.reward_function;
  ASSERT_TRUE(named.has_value());
  EXPECT_EQ(named->task.value_or(""), "addition");
}

TEST(RunSpecKeys, ABadValueNamesItsKey) {
  auto error_of = [](std::vector<std::string> overrides) {
    try {
      build_run_spec(load_rl_config("", overrides));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error_of({"trainer.total_steps=0"}).find("trainer.total_steps"), std::string::npos);
  EXPECT_NE(error_of({"reward_model.reward_clip=[3,1]"}).find("reward_model.reward_clip"), std::string::npos);
  EXPECT_NE(error_of({"cost.type=contains"}).find("cost.contains"), std::string::npos);
  EXPECT_NE(error_of({"reward.type=magic"}).find("reward.type"), std::string::npos);
  EXPECT_NE(error_of({"reward.type=command"}).find("reward.command"), std::string::npos);
  EXPECT_NE(error_of({"cost.type=http"}).find("cost.url"), std::string::npos);
  EXPECT_NE(error_of({"reward.type=command", "reward.shell=cat", "reward.max_output_bytes=0"})
                .find("reward.max_output_bytes: expected > 0"),
            std::string::npos);
  EXPECT_NE(error_of({"trainer.resume_mode=sometimes"}).find("trainer.resume_mode must be disable"), std::string::npos);
  EXPECT_NE(error_of({"algorithm.adv_estimator=remax", "algorithm.filter_groups.enable=true"})
                .find("algorithm.adv_estimator: remax"),
            std::string::npos);
  EXPECT_NE(error_of({"algorithm.program=safe_rlhf"}).find("safe_rlhf needs a cost"), std::string::npos);
}

// Each spec travels as JSON (to_json) and is decoded once (from_json): every field survives the trip.
template <typename Spec>
void expect_round_trip(const Spec& spec, const std::string& name) {
  const nlohmann::json sent = spec;
  const nlohmann::json decoded = sent.get<Spec>();
  EXPECT_EQ(decoded, sent) << name;
}

TEST(RoleSpecKeys, SpecsSurviveTheTripToTheWorkers) {
  const Config config = load_rl_config(
      "", {"actor_rollout_ref.actor.dtype=bf16", "actor_rollout_ref.actor.clip_ratio_high=0.28",
           "actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.actor.kl_loss_type=mse",
           "actor_rollout_ref.actor.policy_loss.loss_mode=gspo", "actor_rollout_ref.rollout.n=4",
           "actor_rollout_ref.rollout.temperature=0.7", "critic.loss_agg_mode=seq-mean-token-mean",
           "critic.optim.lr_scheduler_type=cosine", "actor_rollout_ref.actor.fsdp_config.param_offload=true",
           "actor_rollout_ref.actor.tau_neg=1.5", "actor_rollout_ref.actor.policy_loss.clip_cov_ub=7.0",
           "actor_rollout_ref.actor.policy_loss.ppo_kl_coef=0.25"});
  RoleSpecKeys keys;
  const RoleSpecs specs = all_roles(config, &keys);
  expect_round_trip(specs.actor.spec, "actor");
  expect_round_trip(specs.rollout, "rollout");
  ASSERT_TRUE(specs.ref && specs.critic && specs.reward_model && specs.cost_model);
  expect_round_trip(*specs.ref, "ref");
  expect_round_trip(specs.critic->spec, "critic");
  expect_round_trip(specs.reward_model->spec, "reward_model");
  expect_round_trip(specs.actor.model, "actor's model");
  expect_round_trip(specs.critic->model, "critic's model");
  // The settings arrive typed: what the worker decodes is what the configuration said.
  const ActorSpec actor = nlohmann::json(specs.actor.spec).get<ActorSpec>();
  EXPECT_EQ(actor.dtype, "bf16");
  EXPECT_DOUBLE_EQ(actor.policy_loss.clip_ratio_high.value_or(0), 0.28);
  EXPECT_FALSE(actor.policy_loss.clip_ratio_low.has_value());
  EXPECT_EQ(actor.policy_loss.loss_mode, algo::PolicyLossMode::kGspo);
  EXPECT_EQ(actor.policy_loss.tau_neg, 1.5);
  EXPECT_EQ(actor.policy_loss.tau_pos, 1.0);
  EXPECT_EQ(actor.policy_loss.clip_cov_ub, 7.0);
  EXPECT_EQ(actor.policy_loss.ppo_kl_coef, 0.25);
  EXPECT_EQ(actor.policy_loss.kl_cov_ratio, 0.0002);
  EXPECT_EQ(actor.loss_terms.kl_loss_type, algo::KlType::kK2);
  EXPECT_EQ(actor.train.max_token_len, 16384);
  EXPECT_TRUE(actor.train.param_offload);
  const RolloutSpec rollout = nlohmann::json(specs.rollout).get<RolloutSpec>();
  EXPECT_EQ(rollout.n, 4);
  EXPECT_EQ(rollout.temperature, 0.7);
  EXPECT_EQ(rollout.dtype, "bf16");  // the actor's, rollout.dtype being null
  EXPECT_EQ(rollout.log_prob.max_tokens, 16384);  // the actor's token budget, inherited
  const CriticSpec critic = nlohmann::json(specs.critic->spec).get<CriticSpec>();
  EXPECT_EQ(critic.loss_agg_mode, algo::LossAggMode::kSeqMeanTokenMean);
  EXPECT_EQ(critic.train.optim.schedule.kind, "cosine");
  EXPECT_EQ(critic.train.seed, 2u);
  EXPECT_EQ(specs.cost_critic->spec.train.seed, 3u);
}

// verl's usual layout, an FSDP actor (training tensor parallelism 1) with vLLM at TP 2: the actor generates at its
// training size (every rank holds the whole model); a size that does not divide the training's is still refused.
TEST(RoleSpecKeys, GenerationLargerThanTheTrainingsTensorParallelismGeneratesAtTheTrainings) {
  RoleSpecKeys keys;
  const RoleSpecs verl = all_roles(load_rl_config("", {"actor_rollout_ref.rollout.tensor_model_parallel_size=2"}), &keys);
  EXPECT_EQ(verl.actor.layout.tp, 1);
  EXPECT_EQ(verl.actor.layout.gen_tp, 1);
  const std::string error = testing::error_of([&] {
    all_roles(load_rl_config("", {"actor_rollout_ref.rollout.tensor_model_parallel_size=0"}), &keys);
  });
  EXPECT_NE(error.find("actor_rollout_ref.rollout.tensor_model_parallel_size = 0 must divide"), std::string::npos) << error;
}

// With use_dynamic_bsz the micro-batches are cut by tokens, so a row count that does not divide the mini-batch is
// not an error (verl's examples leave ppo_micro_batch_size_per_gpu at 3 there); without it, it is.
TEST(RoleSpecKeys, MicroBatchRowsAreNotCheckedWhenTokensCutTheMicroBatches) {
  RoleSpecKeys keys;
  const std::vector<std::string> odd = {"actor_rollout_ref.actor.ppo_mini_batch_size=4",
                                        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3"};
  std::vector<std::string> dynamic = odd;
  dynamic.push_back("actor_rollout_ref.actor.use_dynamic_bsz=true");
  EXPECT_NO_THROW(all_roles(load_rl_config("", dynamic), &keys));
  const std::string error = testing::error_of([&] { all_roles(load_rl_config("", odd), &keys); });
  EXPECT_NE(error.find("ppo_micro_batch_size(_per_gpu) = 3 samples per process do not divide"), std::string::npos)
      << error;
}

// verl's optimizer keys: betas and num_cycles of the optim block, and override_optimizer_config's AdamW
// arguments over them (as verl's optimizer_args.update), reach the actor's and the critic's workers; a value
// AdamW cannot take is refused naming the key.
TEST(RoleSpecKeys, VerlsOptimizerKeysReachTheActorAndTheCritic) {
  auto specs_of = [](const std::vector<std::string>& overrides) {
    RoleSpecKeys keys;
    return all_roles(load_rl_config("", overrides), &keys);
  };
  const RoleSpecs specs = specs_of({"actor_rollout_ref.actor.optim.betas=[0.9,0.95]",
                                    "actor_rollout_ref.actor.optim.num_cycles=1.5",
                                    "++actor_rollout_ref.actor.optim.override_optimizer_config.eps=1.0e-6",
                                    "++actor_rollout_ref.actor.optim.override_optimizer_config.foreach=false",
                                    "++actor_rollout_ref.actor.optim.override_optimizer_config.optimizer_cpu_offload=true",
                                    "++actor_rollout_ref.actor.optim.override_optimizer_config.optimizer_offload_fraction=1.0",
                                    "++critic.optim.override_optimizer_config.betas=[0.8,0.99]",
                                    "++critic.optim.override_optimizer_config.lr=3.0e-4"});
  const ActorSpec actor = nlohmann::json(specs.actor.spec).get<ActorSpec>();  // as the worker decodes it
  EXPECT_EQ(actor.train.optim.beta1, 0.9);
  EXPECT_EQ(actor.train.optim.beta2, 0.95);
  EXPECT_EQ(actor.train.optim.eps, 1e-6);
  EXPECT_EQ(actor.train.optim.schedule.num_cycles, 1.5);
  const CriticSpec critic = nlohmann::json(specs.critic->spec).get<CriticSpec>();
  EXPECT_EQ(critic.train.optim.beta1, 0.8);  // the override wins over the block's betas
  EXPECT_EQ(critic.train.optim.beta2, 0.99);
  EXPECT_EQ(critic.train.optim.schedule.lr, 3e-4);
  EXPECT_EQ(critic.train.optim.eps, 1e-8);
  EXPECT_EQ(critic.train.optim.schedule.num_cycles, 0.5);

  const std::string betas = testing::error_of([&] { specs_of({"critic.optim.betas=[0.9,1.5]"}); });
  EXPECT_NE(betas.find("critic.optim.betas: each beta must be in [0, 1)"), std::string::npos) << betas;
  const std::string unknown = testing::error_of(
      [&] { specs_of({"++actor_rollout_ref.actor.optim.override_optimizer_config.momentum=0.9"}); });
  EXPECT_NE(unknown.find("actor_rollout_ref.actor.optim.override_optimizer_config.momentum: not an AdamW argument"),
            std::string::npos)
      << unknown;
  const std::string amsgrad = testing::error_of(
      [&] { specs_of({"++actor_rollout_ref.actor.optim.override_optimizer_config.amsgrad=true"}); });
  EXPECT_NE(amsgrad.find("override_optimizer_config.amsgrad: only false"), std::string::npos) << amsgrad;
  const std::string cycles = testing::error_of([&] { specs_of({"critic.optim.num_cycles=0"}); });
  EXPECT_NE(cycles.find("critic.optim.num_cycles must be > 0"), std::string::npos) << cycles;
}

TEST(RoleSpecKeys, AFieldOfTheWrongTypeNamesTheSpecAndTheField) {
  try {
    nlohmann::json{{"n", "four"}}.get<RolloutSpec>();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rollout spec: field 'n'"), std::string::npos) << e.what();
  }
  // A value no worker could use fails where it is decoded, too.
  EXPECT_THROW(nlohmann::json({{"policy_loss", {{"loss_mode", "opo"}}}}).get<ActorSpec>(), Error);
  EXPECT_THROW(nlohmann::json({{"loss_scale_factor", 0}}).get<ActorSpec>(), Error);
  EXPECT_THROW(nlohmann::json({{"tau_pos", 0}}).get<ActorSpec>(), Error);
  EXPECT_THROW(nlohmann::json({{"policy_loss", {{"clip_cov_lb", 5.0}}}}).get<ActorSpec>(), Error);
  EXPECT_THROW(nlohmann::json({{"loss_agg_mode", "mean"}}).get<CriticSpec>(), Error);
}

}  // namespace
}  // namespace hybridflow
