#include "hybridflow/algo/algo_config.h"

#include "hybridflow/core/error.h"

namespace hybridflow::algo {

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
)";

const std::string kAlgoDefaultsYaml = std::string(kAlgorithmSectionYaml) + R"(actor:
  clip_ratio: 0.2
  clip_ratio_low: null
  clip_ratio_high: null
  clip_ratio_c: 3.0
  loss_agg_mode: token-mean
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
  PolicyLossConfig c;
  c.clip_ratio = actor.get_or<double>("clip_ratio", c.clip_ratio);
  if (actor.has("clip_ratio_low") && !actor.is_null("clip_ratio_low"))
    c.clip_ratio_low = actor.get<double>("clip_ratio_low");
  if (actor.has("clip_ratio_high") && !actor.is_null("clip_ratio_high"))
    c.clip_ratio_high = actor.get<double>("clip_ratio_high");
  c.clip_ratio_c = actor.get_or<double>("clip_ratio_c", c.clip_ratio_c);
  c.agg_mode = parse_loss_agg_mode(actor.get_or<std::string>("loss_agg_mode", "token-mean"));
  return c;
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
