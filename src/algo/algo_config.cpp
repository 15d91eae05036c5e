#include "hybridflow/algo/algo_config.h"

#include <nlohmann/json.hpp>

#include <functional>
#include <mutex>
#include <optional>
#include <set>

#include "hybridflow/core/error.h"
#include "hybridflow/core/logging.h"

namespace hybridflow::algo {
namespace {

// The policy-loss keys, however the section is stored: nullopt for a key that is absent or null.
struct ActorKeys {
  std::function<std::optional<double>(const std::string&)> number;
  std::function<std::optional<std::string>(const std::string&)> text;
};

// Once per process and clip_ratio value: every update_actor reads the config again.
void warn_clip_ratio_defaults(const PolicyLossConfig& c) {
  if (c.clip_ratio == 0.2 || (c.clip_ratio_low && c.clip_ratio_high)) return;
  static std::mutex mutex;
  static std::set<double> warned;
  std::lock_guard<std::mutex> lock(mutex);
  if (!warned.insert(c.clip_ratio).second) return;
  const char* sides = !c.clip_ratio_low && !c.clip_ratio_high ? "clip_ratio_low and clip_ratio_high are"
                      : !c.clip_ratio_low                      ? "clip_ratio_low is"
                                                               : "clip_ratio_high is";
  log_warn("actor.clip_ratio = ", c.clip_ratio, " and actor.", sides, " null: hybridflow clips there at ",
           c.clip_ratio, " but verl at its own default 0.2; set clip_ratio_low/high explicitly to silence this");
}

PolicyLossConfig read_policy_loss(const ActorKeys& keys) {
  PolicyLossConfig c;
  c.clip_ratio = keys.number("clip_ratio").value_or(c.clip_ratio);
  c.clip_ratio_low = keys.number("clip_ratio_low");
  c.clip_ratio_high = keys.number("clip_ratio_high");
  c.clip_ratio_c = keys.number("clip_ratio_c").value_or(c.clip_ratio_c);
  c.agg_mode = parse_loss_agg_mode(keys.text("loss_agg_mode").value_or("token-mean"));
  c.loss_scale_factor = keys.number("loss_scale_factor");
  HF_CHECK(!c.loss_scale_factor || *c.loss_scale_factor > 0, "actor.loss_scale_factor must be > 0 or null, got ",
           *c.loss_scale_factor);
  c.loss_mode = parse_policy_loss_mode(keys.text("policy_loss.loss_mode").value_or("vanilla"));
  warn_clip_ratio_defaults(c);
  return c;
}

}  // namespace

const char* const kAlgorithmSectionYaml = R"(algorithm:
  program: auto
  adv_estimator: gae
  gamma: 1.0
  lam: 1.0
  norm_adv_by_std_in_grpo: true
  use_kl_in_reward: false
  kl_penalty: kl
  kl_ctrl:
    type: fixed
    kl_coef: 0.001
    target_kl: 0.1
    horizon: 10000.0
  safe_rlhf:
    lambda_init: 1.0
    lambda_lr: 0.1
    cost_limit: 0.0
    use_log_lambda: true
    lambda_max: null
    lambda_update_delay_steps: 0
  filter_groups:
    enable: false
    metric: null
    max_num_gen_batches: 0
  rollout_correction:
    rollout_is: null
    rollout_is_threshold: 2.0
)";

const std::string kAlgoDefaultsYaml = std::string(kAlgorithmSectionYaml) + R"(actor:
  clip_ratio: 0.2
  clip_ratio_low: null
  clip_ratio_high: null
  clip_ratio_c: 3.0
  loss_agg_mode: token-mean
  loss_scale_factor: null
  policy_loss:
    loss_mode: vanilla
  entropy_coeff: 0.0
  use_kl_loss: false
  kl_loss_coef: 0.001
  kl_loss_type: low_var_kl
critic:
  cliprange_value: 0.5
)";

AdvantageInput advantage_params(const Config& algorithm) {
  AdvantageInput in;
  in.gamma = algorithm.get_or<double>("gamma", 1.0);
  in.lam = algorithm.get_or<double>("lam", 1.0);
  in.norm_adv_by_std_in_grpo = algorithm.get_or<bool>("norm_adv_by_std_in_grpo", true);
  return in;
}

std::string advantage_estimator_name(const Config& algorithm) {
  auto name = algorithm.get_or<std::string>("adv_estimator", "gae");
  get_advantage_estimator(name);  // throws with the known names
  return name;
}

KlController kl_controller(const Config& algorithm) {
  return KlController::from_config(algorithm.get_or<std::string>("kl_ctrl.type", "fixed"),
                                   algorithm.get_or<double>("kl_ctrl.kl_coef", 0.001),
                                   algorithm.get_or<double>("kl_ctrl.target_kl", 0.1),
                                   algorithm.get_or<double>("kl_ctrl.horizon", 10000.0));
}

KlType reward_kl_type(const Config& algorithm) {
  return parse_kl_type(algorithm.get_or<std::string>("kl_penalty", "kl"));
}

LagrangeConfig lagrange_config(const Config& algorithm) {
  LagrangeConfig c;
  c.lambda_init = algorithm.get_or<double>("safe_rlhf.lambda_init", c.lambda_init);
  c.lambda_lr = algorithm.get_or<double>("safe_rlhf.lambda_lr", c.lambda_lr);
  c.cost_limit = algorithm.get_or<double>("safe_rlhf.cost_limit", c.cost_limit);
  c.use_log_lambda = algorithm.get_or<bool>("safe_rlhf.use_log_lambda", c.use_log_lambda);
  if (algorithm.has("safe_rlhf.lambda_max") && !algorithm.is_null("safe_rlhf.lambda_max"))
    c.lambda_max = algorithm.get<double>("safe_rlhf.lambda_max");
  c.update_delay_steps = algorithm.get_or<int>("safe_rlhf.lambda_update_delay_steps", 0);
  return c;
}

PolicyLossConfig policy_loss_config(const Config& actor) {
  ActorKeys keys;
  keys.number = [&](const std::string& key) -> std::optional<double> {
    if (!actor.has(key) || actor.is_null(key)) return std::nullopt;
    return actor.get<double>(key);
  };
  keys.text = [&](const std::string& key) -> std::optional<std::string> {
    if (!actor.has(key) || actor.is_null(key)) return std::nullopt;
    return actor.get<std::string>(key);
  };
  return read_policy_loss(keys);
}

PolicyLossConfig policy_loss_config(const nlohmann::json& actor) {
  // Dotted keys walk nested objects ("policy_loss.loss_mode").
  auto find = [&](const std::string& key) -> const nlohmann::json* {
    const nlohmann::json* node = &actor;
    size_t begin = 0;
    while (true) {
      const size_t dot = key.find('.', begin);
      const std::string part = key.substr(begin, dot == std::string::npos ? std::string::npos : dot - begin);
      if (!node->is_object() || !node->contains(part)) return nullptr;
      node = &(*node)[part];
      if (dot == std::string::npos) return node->is_null() ? nullptr : node;
      begin = dot + 1;
    }
  };
  ActorKeys keys;
  keys.number = [&](const std::string& key) -> std::optional<double> {
    const auto* v = find(key);
    if (v == nullptr) return std::nullopt;
    HF_CHECK(v->is_number(), "actor.", key, " must be a number, got ", v->dump());
    return v->get<double>();
  };
  keys.text = [&](const std::string& key) -> std::optional<std::string> {
    const auto* v = find(key);
    if (v == nullptr) return std::nullopt;
    HF_CHECK(v->is_string(), "actor.", key, " must be a string, got ", v->dump());
    return v->get<std::string>();
  };
  return read_policy_loss(keys);
}

ActorLossTerms actor_loss_terms(const Config& actor) {
  ActorLossTerms t;
  t.use_kl_loss = actor.get_or<bool>("use_kl_loss", t.use_kl_loss);
  t.kl_loss_coef = actor.get_or<double>("kl_loss_coef", t.kl_loss_coef);
  t.kl_loss_type = parse_kl_type(actor.get_or<std::string>("kl_loss_type", "low_var_kl"));
  t.entropy_coeff = actor.get_or<double>("entropy_coeff", t.entropy_coeff);
  return t;
}

}  // namespace hybridflow::algo
