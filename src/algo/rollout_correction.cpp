#include "hybridflow/algo/rollout_correction.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>

#include "checks.h"
#include "hybridflow/algo/masked.h"

namespace hybridflow::algo {
namespace {

constexpr double kRolloutCorrSafetyBound = 20.0;  // verl's SAFETY_BOUND on every log-ratio before exp
constexpr const char* kRolloutCorrKey = "algorithm.rollout_correction.";

RolloutCorrLevel rollout_corr_level(const Config& algorithm, const std::string& key) {
  if (algorithm.is_null("rollout_correction." + key)) return RolloutCorrLevel::kOff;
  const std::string level = algorithm.get<std::string>("rollout_correction." + key);
  if (level == "token") return RolloutCorrLevel::kToken;
  if (level == "sequence") return RolloutCorrLevel::kSequence;
  if (level == "geometric") return RolloutCorrLevel::kGeometric;
  HF_FAIL(kRolloutCorrKey, key, ": expected null (off), token, sequence or geometric, got '", level, "'");
}

const char* rollout_corr_level_name(RolloutCorrLevel level) {
  switch (level) {
    case RolloutCorrLevel::kToken: return "token";
    case RolloutCorrLevel::kSequence: return "sequence";
    case RolloutCorrLevel::kGeometric: return "geometric";
    default: return "off";
  }
}

RolloutCorrLevel rollout_corr_level_named(const std::string& name) {
  for (auto level : {RolloutCorrLevel::kToken, RolloutCorrLevel::kSequence, RolloutCorrLevel::kGeometric})
    if (name == rollout_corr_level_name(level)) return level;
  return RolloutCorrLevel::kOff;
}

double positive_number(const std::string& text, const std::string& key) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  HF_CHECK(used == text.size() && used > 0 && v > 0 && std::isfinite(v), kRolloutCorrKey, key,
           ": expected a positive number or \"lower_upper\", got '", text, "'");
  return v;
}

// A threshold spec: one positive number (the upper bound), or "lower_upper" with lower <= upper.
struct Bounds {
  std::optional<double> lower;
  double upper = 0;
};
Bounds parse_bounds(const std::string& spec, const std::string& key) {
  const size_t split = spec.find('_');
  if (split == std::string::npos) return {std::nullopt, positive_number(spec, key)};
  Bounds b{positive_number(spec.substr(0, split), key), positive_number(spec.substr(split + 1), key)};
  HF_CHECK(*b.lower <= b.upper, kRolloutCorrKey, key, ": the lower bound must not exceed the upper, got '", spec, "'");
  return b;
}

// The ratio of each token at `level` ([B, R], safety-bounded, 1 at padding), and its log before the bound
// per unit it is judged at ([B, R] for tokens, [B, 1] for sequences).
struct LevelRatio {
  at::Tensor ratio;
  at::Tensor log_unit;
};
LevelRatio level_ratio(const at::Tensor& log_ratio, const at::Tensor& mask, RolloutCorrLevel level) {
  if (level == RolloutCorrLevel::kToken)
    return {torch::exp(log_ratio.clamp(-kRolloutCorrSafetyBound, kRolloutCorrSafetyBound)), log_ratio};
  at::Tensor per_row = (log_ratio * mask).sum(-1, /*keepdim=*/true);
  if (level == RolloutCorrLevel::kGeometric) per_row = per_row / mask.sum(-1, /*keepdim=*/true).clamp_min(1.0);
  return {torch::exp(per_row.clamp(-kRolloutCorrSafetyBound, kRolloutCorrSafetyBound)).expand_as(log_ratio), per_row};
}

// verl's compute_is_metrics / compute_rs_metrics under `prefix` (rollout_is / rollout_rs): mean over valid
// tokens; max, min and the fractions beyond the bounds per unit (token, or sequence with a token); std and
// the effective sample size 1 / E[(w / E w)^2] of the weights clamped to [lower, upper].
void add_spread_metrics(std::map<std::string, double>& metrics, const std::string& prefix, const LevelRatio& r,
                        const at::Tensor& mask, RolloutCorrLevel level, double lower, double upper) {
  const std::string p = "rollout_corr/" + prefix + "_";
  const auto valid = mask != 0;
  if (!valid.any().item<bool>()) return;
  metrics[p + "mean"] = masked_mean(r.ratio, mask).item<double>();
  // Per unit: the tokens, or the rows holding any valid token.
  const auto unit_valid = level == RolloutCorrLevel::kToken ? valid : valid.any(-1, /*keepdim=*/true);
  const auto unit_log = r.log_unit.masked_select(unit_valid);
  metrics[p + "max"] = std::exp(std::min(unit_log.max().item<double>(), kRolloutCorrSafetyBound));
  metrics[p + "min"] = std::exp(std::max(unit_log.min().item<double>(), -kRolloutCorrSafetyBound));
  metrics[p + "ratio_fraction_high"] = (unit_log > std::log(upper)).to(torch::kDouble).mean().item<double>();
  metrics[p + "ratio_fraction_low"] = (unit_log < std::log(lower)).to(torch::kDouble).mean().item<double>();
  const auto clamped = r.ratio.clamp(lower, upper);
  const auto mean = masked_mean(clamped, mask);
  metrics[p + "std"] =
      std::sqrt(std::max(0.0, (masked_mean(clamped.square(), mask) - mean.square()).item<double>()));
  metrics[p + "eff_sample_size"] = 1.0 / masked_mean((clamped / (mean + 1e-8)).square(), mask).item<double>();
}

// Importance weights at config.is_level: truncated at the upper threshold, or zeroed outside [lower, upper]
// (masked IS), 0 at padding, then optionally scaled to mean 1 (over tokens, or over sequences).
at::Tensor importance_weights(const at::Tensor& log_ratio, const at::Tensor& mask, const RolloutCorrectionConfig& c,
                              std::map<std::string, double>& metrics) {
  const LevelRatio r = level_ratio(log_ratio, mask, c.is_level);
  const double lower = c.is_threshold_lower.value_or(1.0 / c.is_threshold);
  add_spread_metrics(metrics, "rollout_is", r, mask, c.is_level, lower, c.is_threshold);
  const auto valid = mask != 0;
  at::Tensor w = c.is_threshold_lower
                     ? torch::where((r.ratio >= lower) & (r.ratio <= c.is_threshold), r.ratio, torch::zeros_like(r.ratio))
                     : r.ratio.clamp_max(c.is_threshold);
  w = torch::where(valid, w, torch::zeros_like(w));
  if (c.is_batch_normalize) {
    at::Tensor mean;
    if (c.is_level == RolloutCorrLevel::kToken) {
      mean = masked_mean(w, mask);
    } else {
      const auto rows = valid.any(-1);
      mean = masked_mean(w, mask, -1).masked_select(rows).mean();
    }
    const double factor = mean.item<double>();
    metrics["rollout_corr/rollout_is_batch_norm_factor"] = factor > 1e-8 ? factor : 1.0;
    if (factor > 1e-8) w = w / factor;
  }
  return w;
}

// verl's divergence-estimator criteria: "token_k1", "seq_sum_k3", ... ("seq_max_k1" does not exist).
std::optional<RejectionCriterion> criterion_named(const std::string& name) {
  for (const char* scope : {"token", "seq_sum", "seq_mean", "seq_max"})
    for (int k = 1; k <= 3; ++k) {
      if (std::string(scope) == "seq_max" && k == 1) continue;
      if (name == std::string(scope) + "_k" + std::to_string(k)) {
        RejectionCriterion c;
        c.name = name;
        c.estimator = k;
        c.scope = scope;
        return c;
      }
    }
  return std::nullopt;
}

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    std::string part = text.substr(start, comma - start);
    part.erase(0, part.find_first_not_of(" \t"));
    part.erase(part.find_last_not_of(" \t") + 1);
    if (!part.empty()) parts.push_back(part);
    start = comma + 1;
  }
  return parts;
}

// rollout_rs "token_k1,seq_max_k2" with rollout_rs_threshold "0.6_1.6,2.5" (one spec per criterion, or one for all).
std::vector<RejectionCriterion> rejection_criteria(const std::string& names, const std::string& thresholds) {
  std::vector<RejectionCriterion> criteria;
  for (const std::string& name : split_list(names)) {
    const auto c = criterion_named(name);
    HF_CHECK(c.has_value(), kRolloutCorrKey, "rollout_rs: '", name, "' is not one of token, sequence, geometric ",
             "or verl's token_k1, token_k2, token_k3, seq_sum_k1..k3, seq_mean_k1..k3, seq_max_k2, seq_max_k3 ",
             "(several joined by commas)");
    if (std::none_of(criteria.begin(), criteria.end(), [&](const auto& d) { return d.name == name; }))
      criteria.push_back(*c);
  }
  HF_CHECK(!criteria.empty(), kRolloutCorrKey, "rollout_rs: no criterion in '", names, "'");
  std::vector<std::string> specs = split_list(thresholds);
  HF_CHECK(specs.size() == 1 || specs.size() == criteria.size(), kRolloutCorrKey, "rollout_rs_threshold: '",
           thresholds, "' gives ", specs.size(), " thresholds for the ", criteria.size(),
           " criteria of rollout_rs: give one for all, or one each (joined by commas)");
  for (size_t i = 0; i < criteria.size(); ++i) {
    RejectionCriterion& c = criteria[i];
    const std::string& spec = specs[specs.size() == 1 ? 0 : i];
    HF_CHECK(c.estimator == 1 || spec.find('_') == std::string::npos, kRolloutCorrKey, "rollout_rs_threshold: ",
             c.name, " takes one upper bound, not lower_upper ('", spec, "')");
    const Bounds bounds = parse_bounds(spec, "rollout_rs_threshold");
    c.upper = bounds.upper;
    if (c.estimator == 1) c.lower = bounds.lower.value_or(1.0 / bounds.upper);
  }
  return criteria;
}

// verl's compute_rollout_rejection_mask: `keep` ([B, R] double, 1 at kept valid tokens) multiplied by every
// criterion's verdict, with each criterion's metrics.
at::Tensor apply_rejection_criteria(const std::vector<RejectionCriterion>& criteria, const at::Tensor& log_ratio,
                                    const at::Tensor& mask, std::map<std::string, double>& metrics) {
  const auto bounded = log_ratio.clamp(-kRolloutCorrSafetyBound, kRolloutCorrSafetyBound);
  const auto valid = mask != 0;
  const auto rows = valid.any(-1);
  const double valid_tokens = std::max(1.0, mask.sum().item<double>());
  const double valid_rows = std::max(1.0, rows.sum().item<double>());
  at::Tensor combined = torch::ones_like(mask);
  for (const RejectionCriterion& c : criteria) {
    const at::Tensor per_token = c.estimator == 1   ? -bounded
                                 : c.estimator == 2 ? 0.5 * bounded.square()
                                                    : torch::exp(bounded) - 1.0 - bounded;
    at::Tensor stat;  // [B, R] for tokens, [B, 1] for sequences
    if (c.scope == "token") {
      stat = per_token;
    } else if (c.scope == "seq_sum") {
      stat = (per_token * mask).sum(-1, /*keepdim=*/true);
    } else if (c.scope == "seq_mean") {
      stat = (per_token * mask).sum(-1, /*keepdim=*/true) / mask.sum(-1, /*keepdim=*/true).clamp_min(1.0);
    } else {
      const auto max = per_token.masked_fill(~valid, -INFINITY).amax(-1, /*keepdim=*/true);
      stat = torch::where(torch::isinf(max), torch::zeros_like(max), max);
    }
    const at::Tensor kept = c.estimator == 1 ? (stat >= std::log(c.lower)) & (stat <= std::log(c.upper))
                                             : stat <= c.upper;
    const at::Tensor keep = kept.to(torch::kDouble).expand_as(mask);
    combined = combined * keep;
    const std::string p = "rollout_corr/rollout_rs_" + c.name + "_";
    const at::Tensor judged = c.scope == "token" ? stat.masked_select(valid) : stat.squeeze(-1).masked_select(rows);
    if (judged.numel() > 0) {
      metrics[p + "mean"] = judged.mean().item<double>();
      metrics[p + "max"] = judged.max().item<double>();
    }
    metrics[p + "masked_fraction"] = (((1.0 - keep) * mask).sum() / valid_tokens).item<double>();
    metrics[p + "seq_masked_fraction"] =
        ((((1.0 - keep) * mask).sum(-1) > 0).logical_and(rows).sum().to(torch::kDouble) / valid_rows).item<double>();
  }
  const at::Tensor kept = combined * mask;
  metrics["rollout_corr/rollout_rs_masked_fraction"] = ((mask - kept).sum() / valid_tokens).item<double>();
  metrics["rollout_corr/rollout_rs_seq_masked_fraction"] =
      (((mask - kept).sum(-1) > 0).logical_and(rows).sum().to(torch::kDouble) / valid_rows).item<double>();
  return kept;
}

}  // namespace

RolloutCorrectionConfig rollout_correction_config(const Config& algorithm) {
  RolloutCorrectionConfig c;
  c.is_level = rollout_corr_level(algorithm, "rollout_is");
  // A number truncates; "lower_upper" masks.
  const Bounds is_bounds =
      parse_bounds(algorithm.get<std::string>("rollout_correction.rollout_is_threshold"), "rollout_is_threshold");
  c.is_threshold = is_bounds.upper;
  c.is_threshold_lower = is_bounds.lower;
  c.is_batch_normalize = algorithm.get<bool>("rollout_correction.rollout_is_batch_normalize");
  // verl's divergence estimators (token_k1, seq_max_k2, ..., comma-chained) or the ratio levels.
  const std::string rs = algorithm.is_null("rollout_correction.rollout_rs")
                             ? std::string()
                             : algorithm.get<std::string>("rollout_correction.rollout_rs");
  if (rs != "token" && rs != "sequence" && rs != "geometric" && !rs.empty() &&
      (rs.find(',') != std::string::npos || rs.find("_k") != std::string::npos)) {
    HF_CHECK(!algorithm.is_null("rollout_correction.rollout_rs_threshold"), kRolloutCorrKey,
             "rollout_rs_threshold must be set when rollout_rs is (", rs, ")");
    c.rs_criteria =
        rejection_criteria(rs, algorithm.get<std::string>("rollout_correction.rollout_rs_threshold"));
    HF_CHECK(algorithm.is_null("rollout_correction.rollout_rs_threshold_lower"), kRolloutCorrKey,
             "rollout_rs_threshold_lower applies to the ratio levels; with ", rs,
             " give a k1 criterion's bounds as rollout_rs_threshold \"lower_upper\"");
  } else {
    c.rs_level = rollout_corr_level(algorithm, "rollout_rs");
  }
  const bool rs_upper_set = !algorithm.is_null("rollout_correction.rollout_rs_threshold") && c.rs_criteria.empty();
  HF_CHECK(c.rs_level == RolloutCorrLevel::kOff || rs_upper_set, kRolloutCorrKey,
           "rollout_rs_threshold must be set when rollout_rs is (the upper bound of the kept ratios)");
  if (rs_upper_set)
    c.rs_threshold = positive_number(algorithm.get<std::string>("rollout_correction.rollout_rs_threshold"),
                                     "rollout_rs_threshold");
  c.rs_threshold_lower = 1.0 / c.rs_threshold;
  if (!algorithm.is_null("rollout_correction.rollout_rs_threshold_lower"))
    c.rs_threshold_lower = positive_number(
        algorithm.get<std::string>("rollout_correction.rollout_rs_threshold_lower"), "rollout_rs_threshold_lower");
  HF_CHECK(c.rs_threshold_lower <= c.rs_threshold, kRolloutCorrKey, "rollout_rs_threshold_lower (",
           c.rs_threshold_lower, ") must not exceed rollout_rs_threshold (", c.rs_threshold, ")");
  if (!algorithm.is_null("rollout_correction.rollout_token_veto_threshold"))
    c.token_veto_threshold = positive_number(
        algorithm.get<std::string>("rollout_correction.rollout_token_veto_threshold"), "rollout_token_veto_threshold");
  const std::string loss_type = algorithm.get<std::string>("rollout_correction.loss_type");
  if (loss_type == "reinforce")
    c.loss_type = RolloutLossType::kReinforce;
  else
    HF_CHECK(loss_type == "ppo_clip", kRolloutCorrKey, "loss_type: expected ppo_clip or reinforce, got '", loss_type, "'");
  return c;
}

nlohmann::json to_json(const RolloutCorrectionConfig& c) {
  nlohmann::json j = {{"rollout_is", rollout_corr_level_name(c.is_level)},
                      {"rollout_is_threshold", c.is_threshold},
                      {"rollout_is_batch_normalize", c.is_batch_normalize},
                      {"rollout_rs", rollout_corr_level_name(c.rs_level)},
                      {"rollout_rs_threshold", c.rs_threshold},
                      {"rollout_rs_threshold_lower", c.rs_threshold_lower},
                      {"loss_type", c.loss_type == RolloutLossType::kReinforce ? "reinforce" : "ppo_clip"}};
  if (c.is_threshold_lower) j["rollout_is_threshold_lower"] = *c.is_threshold_lower;
  for (const RejectionCriterion& r : c.rs_criteria)
    j["rollout_rs_criteria"].push_back({{"name", r.name}, {"lower", r.lower}, {"upper", r.upper}});
  if (c.token_veto_threshold) j["rollout_token_veto_threshold"] = *c.token_veto_threshold;
  return j;
}

RolloutCorrectionConfig rollout_correction_config_from_json(const nlohmann::json& j) {
  RolloutCorrectionConfig c;
  c.is_level = rollout_corr_level_named(j.at("rollout_is").get<std::string>());
  c.is_threshold = j.at("rollout_is_threshold").get<double>();
  c.is_batch_normalize = j.at("rollout_is_batch_normalize").get<bool>();
  c.rs_level = rollout_corr_level_named(j.at("rollout_rs").get<std::string>());
  c.rs_threshold = j.at("rollout_rs_threshold").get<double>();
  c.rs_threshold_lower = j.at("rollout_rs_threshold_lower").get<double>();
  c.loss_type = j.at("loss_type").get<std::string>() == "reinforce" ? RolloutLossType::kReinforce
                                                                     : RolloutLossType::kPpoClip;
  if (j.contains("rollout_is_threshold_lower")) c.is_threshold_lower = j.at("rollout_is_threshold_lower").get<double>();
  for (const nlohmann::json& r : j.value("rollout_rs_criteria", nlohmann::json::array())) {
    auto criterion = criterion_named(r.at("name").get<std::string>());
    HF_CHECK(criterion.has_value(), "rollout correction: unknown rejection criterion ", r.dump());
    criterion->lower = r.at("lower").get<double>();
    criterion->upper = r.at("upper").get<double>();
    c.rs_criteria.push_back(*criterion);
  }
  if (j.contains("rollout_token_veto_threshold"))
    c.token_veto_threshold = j.at("rollout_token_veto_threshold").get<double>();
  return c;
}

RolloutCorrection rollout_correction(const at::Tensor& old_log_prob, const at::Tensor& rollout_log_prob,
                                     const at::Tensor& response_mask, const RolloutCorrectionConfig& config) {
  constexpr const char* kWhere = "algo: rollout_correction";
  detail::check_response_tensor(old_log_prob, "old_log_prob", kWhere);
  detail::check_same_shape(rollout_log_prob, old_log_prob, "rollout_log_prob", kWhere);
  detail::check_same_shape(response_mask, old_log_prob, "response_mask", kWhere);
  torch::NoGradGuard no_grad;
  const auto mask = response_mask.to(torch::kDouble);
  const auto valid = mask != 0;
  const auto zero = torch::zeros_like(mask);
  // pi_old / pi_rollout in log space, 0 at padding.
  const auto log_ratio =
      torch::where(valid, old_log_prob.to(torch::kDouble) - rollout_log_prob.to(torch::kDouble), zero);
  RolloutCorrection out;
  out.metrics["rollout_corr/kl"] = masked_mean(-log_ratio, mask).item<double>();
  out.metrics["rollout_corr/k3_kl"] = masked_mean(torch::exp(log_ratio) - log_ratio - 1.0, mask).item<double>();
  const auto lengths = mask.sum(-1).clamp_min(1.0);
  // log ppl = -mean log-prob over the row; rollout minus training = the row's mean of log_ratio.
  out.metrics["rollout_corr/log_ppl_diff"] = ((log_ratio * mask).sum(-1) / lengths).mean().item<double>();
  if (config.is_level != RolloutCorrLevel::kOff)
    out.weights = importance_weights(log_ratio, mask, config, out.metrics).to(torch::kFloat).contiguous();
  if (!config.rejects()) return out;

  at::Tensor keep = mask.clone();
  const double valid_tokens = std::max(1.0, mask.sum().item<double>());
  if (config.rs_level != RolloutCorrLevel::kOff) {
    const LevelRatio r = level_ratio(log_ratio, mask, config.rs_level);
    add_spread_metrics(out.metrics, "rollout_rs", r, mask, config.rs_level, config.rs_threshold_lower,
                       config.rs_threshold);
    const auto inside = (r.ratio >= config.rs_threshold_lower) & (r.ratio <= config.rs_threshold);
    const auto rs_keep = torch::where(inside, mask, zero);
    out.metrics["rollout_corr/rollout_rs_masked_fraction"] = ((mask - rs_keep).sum() / valid_tokens).item<double>();
    const auto rows = valid.any(-1);
    const auto row_rejected = ((mask - rs_keep).sum(-1) > 0).masked_select(rows);
    out.metrics["rollout_corr/rollout_rs_seq_masked_fraction"] =
        row_rejected.numel() ? row_rejected.to(torch::kDouble).mean().item<double>() : 0.0;
    keep = rs_keep;
  }
  if (!config.rs_criteria.empty()) keep = apply_rejection_criteria(config.rs_criteria, log_ratio, mask, out.metrics);
  if (config.token_veto_threshold) {
    // Judged on the unbounded token log-ratio: one catastrophic token rejects its whole sequence.
    const auto catastrophic = (log_ratio < std::log(*config.token_veto_threshold)) & valid;
    const auto vetoed = catastrophic.any(-1, /*keepdim=*/true);
    out.metrics["rollout_corr/rollout_is_veto_fraction"] = vetoed.to(torch::kDouble).mean().item<double>();
    out.metrics["rollout_corr/rollout_is_catastrophic_token_fraction"] =
        masked_mean(catastrophic.to(torch::kDouble), mask).item<double>();
    keep = torch::where(vetoed, zero, keep);
  }
  out.metrics["rollout_corr/rejected_fraction"] = ((mask - keep).sum() / valid_tokens).item<double>();
  out.keep_mask = keep.to(torch::kFloat).contiguous();
  return out;
}

PolicyLossOutput reinforce_policy_loss(const at::Tensor& rollout_log_prob, const at::Tensor& log_prob,
                                       const at::Tensor& advantages, const at::Tensor& response_mask,
                                       LossAggMode agg_mode, std::optional<double> loss_scale_factor,
                                       const at::Tensor& weights) {
  constexpr const char* kWhere = "algo: reinforce_policy_loss";
  detail::check_response_tensor(log_prob, "log_prob", kWhere);
  detail::check_same_shape(rollout_log_prob, log_prob, "rollout_log_prob", kWhere);
  detail::check_same_shape(advantages, log_prob, "advantages", kWhere);
  detail::check_same_shape(response_mask, log_prob, "response_mask", kWhere);
  if (weights.defined()) detail::check_same_shape(weights, log_prob, "weights", kWhere);
  const auto mask = response_mask.to(log_prob.scalar_type());
  const auto valid = mask != 0;
  // Masked positions zeroed first, so garbage stored there reaches neither the loss nor its gradient.
  const auto zero = torch::zeros_like(log_prob);
  const auto lp = torch::where(valid, log_prob, zero);
  auto token_loss = -torch::where(valid, advantages.to(log_prob.scalar_type()).detach(), zero) * lp;
  if (weights.defined()) token_loss = token_loss * torch::where(valid, weights.to(log_prob.scalar_type()).detach(), zero);
  PolicyLossOutput out;
  out.loss = agg_loss(token_loss, mask, agg_mode, loss_scale_factor);
  torch::NoGradGuard no_grad;
  const auto scalar_zero = torch::zeros({}, log_prob.options());
  out.clip_frac = scalar_zero;
  out.clip_frac_lower = scalar_zero;
  out.approx_kl = masked_mean(torch::where(valid, rollout_log_prob.to(log_prob.scalar_type()), zero) - lp.detach(), mask);
  return out;
}

}  // namespace hybridflow::algo
