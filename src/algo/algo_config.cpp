#include "hybridflow/algo/algo_config.h"

#include <mutex>
#include <optional>
#include <set>

#include "hybridflow/core/error.h"
#include "hybridflow/core/logging.h"

namespace hybridflow::algo {
namespace {

// Once per process and clip_ratio value.
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

std::optional<double> nullable_number(const Config& section, const std::string& key) {
  if (section.is_null(key)) return std::nullopt;
  return section.get<double>(key);
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
  use_pf_ppo: false
  pf_ppo:
    reweight_method: pow
    weight_pow: 2.0
  rollout_correction:
    rollout_is: null
    rollout_is_threshold: "2.0"  # a string: a number truncates, "lower_upper" masks
    rollout_is_batch_normalize: false
    rollout_rs: null
    rollout_rs_threshold: null
    rollout_rs_threshold_lower: null
    rollout_token_veto_threshold: null
    bypass_mode: false
    loss_type: ppo_clip
)";

const char* const kActorLossYaml = R"(clip_ratio: 0.2
clip_ratio_low: null
clip_ratio_high: null
clip_ratio_c: 3.0
loss_agg_mode: token-mean
loss_scale_factor: null
tau_pos: 1.0
tau_neg: 1.05
policy_loss:
  loss_mode: vanilla
  clip_cov_ratio: 0.0002
  clip_cov_lb: 1.0
  clip_cov_ub: 5.0
  kl_cov_ratio: 0.0002
  ppo_kl_coef: 0.1
entropy_coeff: 0.0
use_kl_loss: false
kl_loss_coef: 0.001
kl_loss_type: low_var_kl
)";

std::string indent_yaml(const std::string& yaml, int spaces) {
  const std::string pad(static_cast<size_t>(spaces), ' ');
  std::string out;
  size_t begin = 0;
  while (begin < yaml.size()) {
    const size_t end = yaml.find('\n', begin);
    const size_t stop = end == std::string::npos ? yaml.size() : end + 1;
    out += pad + yaml.substr(begin, stop - begin);
    begin = stop;
  }
  return out;
}

const std::string kAlgoDefaultsYaml = std::string(kAlgorithmSectionYaml) + "actor:\n" + indent_yaml(kActorLossYaml, 2);

AdvantageInput advantage_params(const Config& algorithm) {
  AdvantageInput in;
  in.gamma = algorithm.get<double>("gamma");
  in.lam = algorithm.get<double>("lam");
  in.norm_adv_by_std_in_grpo = algorithm.get<bool>("norm_adv_by_std_in_grpo");
  return in;
}

std::string advantage_estimator_name(const Config& algorithm) {
  auto name = algorithm.get<std::string>("adv_estimator");
  get_advantage_estimator(name);  // throws with the known names
  return name;
}

KlController kl_controller(const Config& algorithm) {
  return KlController::from_config(algorithm.get<std::string>("kl_ctrl.type"), algorithm.get<double>("kl_ctrl.kl_coef"),
                                   algorithm.get<double>("kl_ctrl.target_kl"), algorithm.get<double>("kl_ctrl.horizon"));
}

KlType reward_kl_type(const Config& algorithm) {
  return parse_kl_type(algorithm.get<std::string>("kl_penalty"));
}

LagrangeConfig lagrange_config(const Config& algorithm) {
  LagrangeConfig c;
  c.lambda_init = algorithm.get<double>("safe_rlhf.lambda_init");
  c.lambda_lr = algorithm.get<double>("safe_rlhf.lambda_lr");
  c.cost_limit = algorithm.get<double>("safe_rlhf.cost_limit");
  c.use_log_lambda = algorithm.get<bool>("safe_rlhf.use_log_lambda");
  c.lambda_max = nullable_number(algorithm, "safe_rlhf.lambda_max");
  c.update_delay_steps = algorithm.get<int>("safe_rlhf.lambda_update_delay_steps");
  return c;
}

PolicyLossConfig policy_loss_config(const Config& actor) {
  PolicyLossConfig c;
  c.clip_ratio = actor.get<double>("clip_ratio");
  c.clip_ratio_low = nullable_number(actor, "clip_ratio_low");
  c.clip_ratio_high = nullable_number(actor, "clip_ratio_high");
  c.clip_ratio_c = actor.get<double>("clip_ratio_c");
  c.agg_mode = parse_loss_agg_mode(actor.get<std::string>("loss_agg_mode"));
  c.loss_scale_factor = nullable_number(actor, "loss_scale_factor");
  HF_CHECK(!c.loss_scale_factor || *c.loss_scale_factor > 0, "actor.loss_scale_factor must be > 0 or null, got ",
           *c.loss_scale_factor);
  c.loss_mode = parse_policy_loss_mode(actor.get<std::string>("policy_loss.loss_mode"));
  c.tau_pos = actor.get<double>("tau_pos");
  c.tau_neg = actor.get<double>("tau_neg");
  c.clip_cov_ratio = actor.get<double>("policy_loss.clip_cov_ratio");
  c.clip_cov_lb = actor.get<double>("policy_loss.clip_cov_lb");
  c.clip_cov_ub = actor.get<double>("policy_loss.clip_cov_ub");
  c.kl_cov_ratio = actor.get<double>("policy_loss.kl_cov_ratio");
  c.ppo_kl_coef = actor.get<double>("policy_loss.ppo_kl_coef");
  check_policy_loss_config(c);
  warn_clip_ratio_defaults(c);
  return c;
}

ActorLossTerms actor_loss_terms(const Config& actor) {
  ActorLossTerms t;
  t.use_kl_loss = actor.get<bool>("use_kl_loss");
  t.kl_loss_coef = actor.get<double>("kl_loss_coef");
  t.kl_loss_type = parse_kl_type(actor.get<std::string>("kl_loss_type"));
  t.entropy_coeff = actor.get<double>("entropy_coeff");
  return t;
}

}  // namespace hybridflow::algo
