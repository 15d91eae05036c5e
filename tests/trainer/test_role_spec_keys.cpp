// Every configuration key of a role has one reader. The role specs (trainer/role_spec_builders.h) note the
// keys they read; held against the `hybridflow train` reference in docs/configuration.md, a documented role
// key that nothing reads, a key that two specs read, or a key read but not documented fails here, naming it.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include "hybridflow/core/error.h"
#include "hybridflow/trainer/rl_trainer.h"
#include "trainer/role_spec_builders.h"

namespace hybridflow {
namespace {

// The sections whose keys configure a role's workers.
const char* const kRoleSections[] = {"model.", "actor_rollout_ref.", "critic.", "reward_model.", "cost_model."};

// Role-section keys that no role spec reads, and who reads them instead.
const std::map<std::string, std::string> kReadElsewhere = {
    {"actor_rollout_ref.num_processes", "placement (placement_spec.cpp)"},
    {"actor_rollout_ref.rollout.num_processes", "placement (placement_spec.cpp)"},
    {"actor_rollout_ref.rollout.staleness", "placement (placement_spec.cpp)"},
    {"critic.num_processes", "placement (placement_spec.cpp)"},
    {"reward_model.num_processes", "placement (placement_spec.cpp)"},
    {"cost_model.num_processes", "placement (placement_spec.cpp)"},
    {"reward_model.enable", "the trainer's choice of roles"},
    {"cost_model.enable", "the trainer's choice of roles"},
    {"reward_model.overlong_buffer.enable", "the sequence score (rl_stages.cpp)"},
    {"reward_model.overlong_buffer.len", "the sequence score (rl_stages.cpp)"},
    {"reward_model.overlong_buffer.penalty_factor", "the sequence score (rl_stages.cpp)"},
    {"reward_model.overlong_buffer.log", "the sequence score (rl_stages.cpp)"},
    {"reward_model.reward_clip", "the sequence score (score_guard.cpp)"},
};

bool in_role_section(const std::string& key) {
  for (const char* section : kRoleSections)
    if (key.rfind(section, 0) == 0) return true;
  return false;
}

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

TEST(RoleSpecKeys, EveryDocumentedRoleKeyHasExactlyOneReader) {
  const Config config = load_rl_config("", {});
  RoleSpecKeys keys;
  all_roles(config, &keys);
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
    if (!in_role_section(key)) continue;
    const auto it = readers.find(key);
    if (it == readers.end()) {
      ADD_FAILURE() << "docs/configuration.md documents " << key << ", which no role spec (nor any reader listed "
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
           "critic.optim.lr_scheduler_type=cosine", "actor_rollout_ref.actor.fsdp_config.param_offload=true"});
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

TEST(RoleSpecKeys, AFieldOfTheWrongTypeNamesTheSpecAndTheField) {
  try {
    nlohmann::json{{"n", "four"}}.get<RolloutSpec>();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rollout spec: field 'n'"), std::string::npos) << e.what();
  }
  // A value no worker could use fails where it is decoded, too.
  EXPECT_THROW(nlohmann::json({{"policy_loss", {{"loss_mode", "clip_cov"}}}}).get<ActorSpec>(), Error);
  EXPECT_THROW(nlohmann::json({{"loss_scale_factor", 0}}).get<ActorSpec>(), Error);
  EXPECT_THROW(nlohmann::json({{"loss_agg_mode", "mean"}}).get<CriticSpec>(), Error);
}

}  // namespace
}  // namespace hybridflow
