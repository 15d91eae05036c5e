#include "run_spec_builders.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "hybridflow/algo/algo_config.h"
#include "hybridflow/core/config_json.h"
#include "hybridflow/core/error.h"
#include "hybridflow/core/logging.h"
#include "hybridflow/runtime/call_profiler.h"
#include "hybridflow/trainer/rl_program.h"
#include "hybridflow/trainer/rollout_sampling.h"

namespace hybridflow {
namespace {

TrainerRunSpec trainer_run_spec(const ConfigReader& c) {
  TrainerRunSpec t;
  t.total_steps = c.get<int64_t>("trainer.total_steps");
  HF_CHECK(t.total_steps > 0, "trainer.total_steps must be > 0, got ", t.total_steps);
  t.seed = static_cast<uint64_t>(c.get<int64_t>("trainer.seed"));
  t.run_dir = c.get<std::string>("trainer.run_dir");
  t.save_checkpoint = c.get<bool>("trainer.save_checkpoint");
  t.save_freq = c.get<int64_t>("trainer.save_freq");
  HF_CHECK(!t.saves() || !t.run_dir.empty(),
           "trainer.save_checkpoint / trainer.save_freq need trainer.run_dir (checkpoints go to <run_dir>/checkpoints)");
  t.max_ckpt_to_keep = c.get<int64_t>("trainer.max_ckpt_to_keep");
  t.resume_mode = c.get<std::string>("trainer.resume_mode");
  t.resume_from_path = c.get<std::string>("trainer.resume_from_path");
  const std::string& mode = t.resume_mode;
  const std::string& path = t.resume_from_path;
  HF_CHECK(mode == "disable" || mode == "auto" || mode == "resume_path", "trainer.resume_mode must be disable, ",
           "auto or resume_path, got '", mode, "'");
  // verl reads the path only in resume_path mode (auto takes the newest checkpoint of the run directory).
  if (!path.empty() && mode != "resume_path") {
    log_warn("trainer.resume_from_path (", path, ") is not read with trainer.resume_mode '", mode,
             "', as in verl; set trainer.resume_mode=resume_path to resume from it");
    t.resume_from_path.clear();
  }
  t.max_rollout_restarts = c.get<int64_t>("trainer.max_rollout_restarts");
  HF_CHECK(t.max_rollout_restarts >= 0, "trainer.max_rollout_restarts must be >= 0 (0: a dead rollout worker stops ",
           "the run), got ", t.max_rollout_restarts);
  t.log_every = std::max<int64_t>(1, c.get<int64_t>("trainer.log_every"));
  t.test_freq = c.get<int64_t>("trainer.test_freq");
  t.log_samples_freq = c.get<int64_t>("trainer.log_samples_freq");
  t.log_samples_count = c.get<int64_t>("trainer.log_samples_count");
  t.val_before_train = c.get<bool>("trainer.val_before_train");
  t.val_only = c.get<bool>("trainer.val_only");
  t.log_val_generations = c.get<int64_t>("trainer.log_val_generations");
  HF_CHECK(t.log_val_generations >= 0, "trainer.log_val_generations must be >= 0 (held-out responses logged per ",
           "validation; 0 = none), got ", t.log_val_generations);
  // verl writes null for "off"; "" means the same here.
  for (auto [key, dir] : {std::pair{"trainer.rollout_data_dir", &t.rollout_data_dir},
                          std::pair{"trainer.validation_data_dir", &t.validation_data_dir}})
    *dir = c.is_null(key) ? std::string() : c.get<std::string>(key);
  {
    // The held-out prompts' sampling is the trainer's (it asks for it per call), though verl keeps it under the rollout.
    const std::string v = "actor_rollout_ref.rollout.val_kwargs.";
    TrainerRunSpec::ValKwargs& k = t.val_kwargs;
    k.n = c.get<int64_t>(v + "n");
    k.temperature = c.get<double>(v + "temperature");
    // verl's agent loop samples the held-out responses at val_kwargs.temperature whatever do_sample says, so
    // a temperature above 0 samples here too (0: greedy).
    k.do_sample = c.get<bool>(v + "do_sample") || k.temperature > 0;
    k.top_p = c.get<double>(v + "top_p");
    k.top_k = top_k_from_config(c.get<int64_t>(v + "top_k"), v + "top_k");
    HF_CHECK(k.n >= 1, v, "n must be >= 1 (responses per held-out prompt), got ", k.n);
    HF_CHECK(k.do_sample || k.n == 1, v, "n is ", k.n, " but ", v, "temperature is 0 and do_sample false: greedy ",
             "responses to a prompt are all the same; set a temperature > 0 or n: 1");
    HF_CHECK(!k.do_sample || k.temperature > 0, v, "do_sample is true but ", v, "temperature is ", k.temperature,
             ": sampling needs a temperature > 0");
    HF_CHECK(k.top_p > 0 && k.top_p <= 1, v, "top_p must be in (0, 1], got ", k.top_p);
  }
  t.balance_batch = c.get<bool>("trainer.balance_batch");
  t.critic_warmup = c.get<int64_t>("trainer.critic_warmup");
  HF_CHECK(t.critic_warmup >= 0, "trainer.critic_warmup must be >= 0 (steps that train only the critic), got ",
           t.critic_warmup);
  t.threads_per_worker = c.get<int>("trainer.threads_per_worker");
  t.logger = c.get<std::vector<std::string>>("trainer.logger");
  t.device = c.get<std::string>("trainer.device");
  t.nnodes = run_spec_nnodes(c).value_or(1);
  return t;
}

// A data key holding one path or a list of them (verl's train_files lists several, read as one set); null,
// "" and [] are none.
std::vector<std::string> data_files(const ConfigReader& c, const std::string& key) {
  if (c.is_null(key)) return {};
  const auto dot = key.rfind('.');
  const nlohmann::ordered_json value = config_to_json(c.config().subtree(key.substr(0, dot)))[key.substr(dot + 1)];
  std::vector<std::string> files;
  if (value.is_string()) {
    if (!value.get<std::string>().empty()) files.push_back(value.get<std::string>());
    return files;
  }
  HF_CHECK(value.is_array(), key, " expects a file or a list of files, got ", value.dump(), " (",
           c.config().origin(key), ")");
  for (const auto& item : value) {
    HF_CHECK(item.is_string() && !item.get<std::string>().empty(), key, " expects a list of file paths, got ",
             item.dump(), " in it (", c.config().origin(key), ")");
    files.push_back(item.get<std::string>());
  }
  return files;
}

DataSpec run_spec_data(const ConfigReader& c) {
  DataSpec d;
  d.task = c.get<std::string>("data.task");
  d.min_digits = c.get<int>("data.min_digits");
  d.max_digits = c.get<int>("data.max_digits");
  d.min_length = c.get<int>("data.min_length");
  d.max_length = c.get<int>("data.max_length");
  d.train_files = data_files(c, "data.train_file");
  d.test_files = data_files(c, "data.test_file");
  d.train_size = c.get<int64_t>("data.train_size");
  d.train_max_samples = c.get<int64_t>("data.train_max_samples");
  d.prompt_key = c.get<std::string>("data.prompt_key");
  d.reward_fn_key = c.get<std::string>("data.reward_fn_key");
  HF_CHECK(!d.prompt_key.empty() && !d.reward_fn_key.empty(), "data.prompt_key and data.reward_fn_key name data ",
           "columns; got '", d.prompt_key, "' and '", d.reward_fn_key, "'");
  HF_CHECK(d.train_max_samples == -1 || d.train_max_samples > 0, "data.train_max_samples must be -1 (every training ",
           "prompt) or > 0, got ", d.train_max_samples);
  d.train_batch_size = c.get<int64_t>("data.train_batch_size");
  d.gen_batch_size = c.is_null("data.gen_batch_size") ? d.train_batch_size : c.get<int64_t>("data.gen_batch_size");
  d.test_size = c.get<int64_t>("data.test_size");
  // verl's data.val_max_samples: at most N held-out rows (-1: all of them); here the held-out prompts scored.
  const int64_t val_max = c.get<int64_t>("data.val_max_samples");
  HF_CHECK(val_max == -1 || val_max > 0, "data.val_max_samples must be -1 (data.test_size decides) or > 0, got ",
           val_max);
  if (val_max > 0) {
    HF_CHECK(c.config().is_default("data.test_size") || d.test_size == val_max, "data.val_max_samples (", val_max,
             ") and data.test_size (", d.test_size, ") both set how many held-out prompts are scored; set one");
    d.test_size = val_max;
  }
  d.shuffle = c.get<bool>("data.shuffle");
  if (!c.is_null("data.seed")) {
    const int64_t seed = c.get<int64_t>("data.seed");
    HF_CHECK(seed >= 0, "data.seed must be >= 0 (or null: trainer.seed), got ", seed);
    d.seed = static_cast<uint64_t>(seed);
  }
  return d;
}

// The Config-taking readers of algo/ (algo_config.h, rollout_correction.h) read these keys of `algorithm`;
// noted here so that the key test sees them under the algorithm spec.
void note_algo_reads(const ConfigReader& algorithm, std::initializer_list<const char*> keys) {
  for (const char* key : keys) algorithm.note(key);
}

// A scorer's section (reward or cost) as its typed spec: every key is read, whatever the type, so that each
// has this one reader; the spec is checked only where a scorer is made of it.
RewardFunctionSpec reward_function_spec(const ConfigReader& c, const std::string& section, const std::string& type) {
  const ConfigReader keys = c.subtree(section);
  RewardFunctionSpec f;
  f.section = section;
  f.type = type;
  if (!keys.is_null("command")) f.command = keys.get<std::vector<std::string>>("command");
  if (!keys.is_null("shell")) f.shell = keys.get<std::string>("shell");
  if (!keys.is_null("url")) f.url = keys.get<std::string>("url");
  f.allowed_hosts = keys.get<std::vector<std::string>>("allowed_hosts");
  f.timeout_s = keys.get<double>("timeout_s");
  f.max_output_bytes = keys.get<int64_t>("max_output_bytes");
  if (section == "reward" && !keys.is_null("task")) f.task = keys.get<std::string>("task");
  return f;
}

ScoringSpec scoring_spec(const ConfigReader& c) {
  ScoringSpec s;
  s.reward_type = c.get<std::string>("reward.type");
  HF_CHECK(s.reward_type == "task" || s.reward_type == "none" || s.reward_type == "command" || s.reward_type == "http",
           "reward.type: expected task, none, command or http, got '", s.reward_type, "'");
  s.cost_type = c.get<std::string>("cost.type");
  HF_CHECK(s.cost_type == "none" || s.cost_type == "contains" || s.cost_type == "command" || s.cost_type == "http",
           "cost.type: expected none | contains | command | http, got '", s.cost_type, "'");
  RewardFunctionSpec reward = reward_function_spec(c, "reward", s.reward_type);
  RewardFunctionSpec cost = reward_function_spec(c, "cost", s.cost_type);
  if (auto custom = custom_reward_function_spec(c, reward)) {
    reward = std::move(*custom);
    s.reward_type = "command";
  }
  // reward.type task without reward.task scores with data.task's own rule (no scorer made).
  if (s.reward_type == "command" || s.reward_type == "http" || (s.reward_type == "task" && reward.task))
    s.reward_function = std::move(reward);
  if (s.cost_type == "command" || s.cost_type == "http") s.cost_function = std::move(cost);
  for (const auto* scorer : {&s.reward_function, &s.cost_function})
    if (*scorer) check_reward_function_spec(**scorer);
  s.cost_contains = c.get<std::vector<std::string>>("cost.contains");
  HF_CHECK(s.cost_type != "contains" || !s.cost_contains.empty(),
           "cost.type contains needs a non-empty cost.contains list of strings");
  s.reward_model = c.get<bool>("reward_model.enable");
  s.cost_model = c.get<bool>("cost_model.enable");
  const std::string clip_key = "reward_model.reward_clip";
  if (!c.is_null(clip_key)) {
    const auto range = c.get<std::vector<double>>(clip_key);
    HF_CHECK(range.size() == 2 && std::isfinite(range[0]) && std::isfinite(range[1]) && range[0] < range[1], clip_key,
             ": expected null or [lo, hi] with finite lo < hi, got ", range.size(), " value(s)",
             range.size() == 2 ? " [" + std::to_string(range[0]) + ", " + std::to_string(range[1]) + "]" : "");
    s.reward_clip = std::make_pair(range[0], range[1]);
  }
  const ConfigReader overlong = c.subtree("reward_model.overlong_buffer");
  ScoringSpec::OverlongBuffer& o = s.overlong_buffer;
  o.enable = overlong.get<bool>("enable");
  o.len = overlong.get<int64_t>("len");
  o.penalty_factor = overlong.get<double>("penalty_factor");
  o.log = overlong.get<bool>("log");
  if (!overlong.is_null("max_resp_len")) {
    o.max_resp_len = overlong.get<int64_t>("max_resp_len");
    HF_CHECK(o.max_resp_len > 0, "reward_model.overlong_buffer.max_resp_len must be > 0 (or null: the response ",
             "budget), got ", o.max_resp_len);
  }
  return s;
}

// DAPO filters on the sequence score before the rollout's log-probs are computed, and generates only
// sampled rounds.
void check_dapo_settings(const AlgorithmSpec& a) {
  HF_CHECK(a.adv_estimator != "remax", "algorithm.adv_estimator: remax needs greedy baselines that dapo's dynamic ",
           "sampling (algorithm.filter_groups.enable) does not generate; use grpo, rloo or reinforce_plus_plus");
  // Every score here is one number per sequence (rule + reward model + overlong penalty): verl's acc, score
  // and seq_reward name it; seq_final_reward (after the KL penalty) is not computed before filtering.
  const std::string metric = a.filter_groups.metric.value_or("acc");
  HF_CHECK(metric == "acc" || metric == "score" || metric == "seq_reward",
           "algorithm.filter_groups.metric: expected acc, score or seq_reward (all the sequence score), got '",
           metric, "'");
}

AlgorithmSpec algorithm_spec(const ConfigReader& c, const ScoringSpec& scoring) {
  AlgorithmSpec a;
  const ConfigReader algorithm = c.subtree("algorithm");
  const Config& section = algorithm.config();
  a.adv_estimator = algo::advantage_estimator_name(section);
  a.advantage = algo::advantage_params(section);
  a.reward_kl_type = algo::reward_kl_type(section);
  note_algo_reads(algorithm, {"adv_estimator", "gamma", "lam", "norm_adv_by_std_in_grpo", "kl_penalty"});
  a.use_kl_in_reward = algorithm.get<bool>("use_kl_in_reward");
  a.kl_ctrl.type = algorithm.get<std::string>("kl_ctrl.type");
  a.kl_ctrl.kl_coef = algorithm.get<double>("kl_ctrl.kl_coef");
  a.kl_ctrl.target_kl = algorithm.get<double>("kl_ctrl.target_kl");
  a.kl_ctrl.horizon = algorithm.get<double>("kl_ctrl.horizon");
  a.kl_ctrl.controller();  // checked here, before any worker starts
  a.rollout_correction = algo::rollout_correction_config(section);
  note_algo_reads(algorithm, {"rollout_correction.rollout_is", "rollout_correction.rollout_is_threshold",
                              "rollout_correction.rollout_is_batch_normalize", "rollout_correction.rollout_rs",
                              "rollout_correction.rollout_rs_threshold", "rollout_correction.rollout_rs_threshold_lower",
                              "rollout_correction.rollout_token_veto_threshold", "rollout_correction.loss_type"});
  a.bypass_mode = algorithm.get<bool>("rollout_correction.bypass_mode");
  if (scoring.has_cost()) {
    a.safe_rlhf = algo::lagrange_config(section);
    note_algo_reads(algorithm, {"safe_rlhf.lambda_init", "safe_rlhf.lambda_lr", "safe_rlhf.cost_limit",
                                "safe_rlhf.use_log_lambda", "safe_rlhf.lambda_max", "safe_rlhf.lambda_update_delay_steps"});
  }
  a.filter_groups.enable = algorithm.get<bool>("filter_groups.enable");
  if (!algorithm.is_null("filter_groups.metric")) a.filter_groups.metric = algorithm.get<std::string>("filter_groups.metric");
  a.filter_groups.max_num_gen_batches = algorithm.get<int64_t>("filter_groups.max_num_gen_batches");
  a.use_pf_ppo = algorithm.get<bool>("use_pf_ppo");
  a.pf_ppo.reweight = algo::parse_pf_ppo_reweight(algorithm.get<std::string>("pf_ppo.reweight_method"));
  a.pf_ppo.weight_pow = algorithm.get<double>("pf_ppo.weight_pow");
  HF_CHECK(std::isfinite(a.pf_ppo.weight_pow), "algorithm.pf_ppo.weight_pow must be finite, got ", a.pf_ppo.weight_pow);
  // verl resamples in its gae branch only; elsewhere its key does nothing, which a run here should not hide.
  HF_CHECK(!a.use_pf_ppo || a.adv_estimator == "gae", "algorithm.use_pf_ppo resamples PPO's batch: it needs ",
           "algorithm.adv_estimator gae (verl applies it only there), got ", a.adv_estimator);
  a.program = resolve_rl_program(c, a.adv_estimator, scoring.has_cost());
  if (a.program == "dapo") check_dapo_settings(a);
  HF_CHECK(a.program != "safe_rlhf" || scoring.has_cost(),
           "algorithm.program: safe_rlhf needs a cost: set cost_model.enable or cost.type");
  check_rl_program(a.program, c.config());  // a registered program's own check, on its own keys
  return a;
}

}  // namespace

std::string resolve_rl_program(const ConfigReader& c, const std::string& adv_estimator, bool has_cost) {
  const std::string name = c.get<std::string>("algorithm.program");
  if (name != "auto") {
    get_rl_program(name);  // throws with the known names
    return name;
  }
  const bool filter_groups = c.get<bool>("algorithm.filter_groups.enable");
  if (has_cost) return "safe_rlhf";
  if (filter_groups) return "dapo";
  if (adv_estimator == "gae") return "ppo";
  const auto names = rl_program_names();
  return std::find(names.begin(), names.end(), adv_estimator) != names.end() ? adv_estimator : "policy_gradient";
}

std::optional<int64_t> run_spec_nnodes(const ConfigReader& c) {
  if (c.is_null("trainer.nnodes")) return std::nullopt;
  return c.get<int64_t>("trainer.nnodes");
}

DataSpec build_data_spec(const Config& config, RoleSpecKeys* keys) {
  return run_spec_data(ConfigReader(config, keys ? &(*keys)["data"] : nullptr));
}

namespace {

ProfilerRunSpec::Role role_profiler(const ConfigReader& c, const std::string& section) {
  const std::string key = section + ".profiler";
  const ConfigReader keys = c.subtree(key);
  ProfilerRunSpec::Role r;
  r.enable = keys.get<bool>("enable");
  r.all_ranks = keys.get<bool>("all_ranks");
  for (int64_t rank : keys.get<std::vector<int64_t>>("ranks")) r.ranks.push_back(static_cast<int>(rank));
  for (int rank : r.ranks) HF_CHECK(rank >= 0, key, ".ranks: a rank must be >= 0, got ", rank);
  HF_CHECK(!r.enable || r.all_ranks || !r.ranks.empty(), key, ".enable is true but ", key, ".ranks is empty and ",
           key, ".all_ranks false, so no rank would be profiled: name the ranks (e.g. [0]) or set all_ranks");
  r.contents = keys.get<std::vector<std::string>>("tool_config.torch.contents");
  for (const std::string& content : r.contents)
    HF_CHECK(is_profile_content(content), key, ".tool_config.torch.contents: '", content, "' is not one of cpu, cuda, memory, shapes, stack",
             content == "profile-by-stage" || content == "merge-profiles" ? " (hybridflow writes one trace per call "
                                                                            "and step, and sums its phases itself)"
                                                                          : "");
  // Every call is its own trace here, whichever verl's discrete asks for (one per call, or one per step).
  keys.get<bool>("tool_config.torch.discrete");
  return r;
}

ProfilerRunSpec profiler_spec(const ConfigReader& c, const std::string& run_dir) {
  ProfilerRunSpec p;
  const std::string tool = c.is_null("global_profiler.tool") ? "" : c.get<std::string>("global_profiler.tool");
  HF_CHECK(tool.empty() || tool == "torch" || tool == "torch_memory", "global_profiler.tool: '", tool,
           "' is not supported; hybridflow profiles with libtorch's profiler: torch, or torch_memory (CUDA memory ",
           "snapshots), or null: off",
           tool == "nsys" ? ". For Nsight Systems run the whole command under nsys (nsys profile hybridflow train ...)"
                          : "");
  p.on = !tool.empty();
  p.tool = tool;
  const std::string memory_key = "global_profiler.global_tool_config.torch_memory";
  p.memory.max_entries = c.get<int64_t>(memory_key + ".trace_alloc_max_entries");
  p.memory.context = c.get<std::string>(memory_key + ".context");
  p.memory.stacks = c.get<std::string>(memory_key + ".stacks");
  check_cuda_memory_history_options(p.memory, memory_key);
  // libtorch's C++ recorder keeps whole stacks; verl's depth limit has nothing to cut.
  HF_CHECK(c.get<int64_t>(memory_key + ".stack_depth") >= 1, memory_key, ".stack_depth must be >= 1, got ",
           c.get<int64_t>(memory_key + ".stack_depth"));
  if (!c.is_null("global_profiler.steps")) p.steps = c.get<std::vector<int64_t>>("global_profiler.steps");
  for (size_t i = 0; i < p.steps.size(); ++i)
    HF_CHECK(p.steps[i] >= 1 && (i == 0 || p.steps[i] > p.steps[i - 1]), "global_profiler.steps: expected ascending ",
             "step numbers from 1 (the first step is 1), got ", nlohmann::json(p.steps).dump());
  // Unset: beside the run's other files, where `hybridflow report` finds them; verl's outputs/profile without one.
  p.save_path = !c.is_null("global_profiler.save_path") ? c.get<std::string>("global_profiler.save_path")
                : run_dir.empty()                       ? std::string("outputs/profile")
                                                        : run_dir + "/profile";
  p.trace = c.get<bool>("global_profiler.trace");
  p.actor = role_profiler(c, "actor_rollout_ref.actor");
  p.rollout = role_profiler(c, "actor_rollout_ref.rollout");
  p.ref = role_profiler(c, "actor_rollout_ref.ref");
  p.critic = role_profiler(c, "critic");
  p.reward_model = role_profiler(c, "reward_model");
  const bool any_role = p.actor.enable || p.rollout.enable || p.ref.enable || p.critic.enable || p.reward_model.enable;
  const bool torch_tool = tool == "torch";
  HF_CHECK(!torch_tool || !p.steps.empty(), "global_profiler.tool is torch but global_profiler.steps is empty: name ",
           "the steps to profile (e.g. [2])");
  HF_CHECK(!torch_tool || any_role, "global_profiler.tool is torch but no role's profiler is enabled: set e.g. ",
           "actor_rollout_ref.actor.profiler.enable=true");
  HF_CHECK(p.on || !any_role, "a role's profiler is enabled but global_profiler.tool is null: set ",
           "global_profiler.tool=torch and global_profiler.steps");
  // torch_memory as verl runs it: without a role's section, every rank of the actor's processes dumps a snapshot
  // after every step (global_profiler.steps narrows the steps).
  if (tool == "torch_memory" && !any_role) {
    p.actor.enable = true;
    p.actor.all_ranks = true;
  }
  HF_CHECK(!p.on || !p.save_path.empty(), "global_profiler.save_path is empty: name the directory for the traces");
  return p;
}

}  // namespace

RunSpec rl_run_spec(const Config& config) { return build_run_spec(config); }

RunSpec build_run_spec(const Config& config, RoleSpecKeys* keys) {
  auto reader = [&](const char* part) { return ConfigReader(config, keys ? &(*keys)[part] : nullptr); };
  RunSpec spec;
  spec.trainer = trainer_run_spec(reader("trainer"));
  spec.data = run_spec_data(reader("data"));
  HF_CHECK(!spec.trainer.val_only || spec.data.test_size > 0, "trainer.val_only is true but there are no held-out ",
           "prompts to score: data.test_size is 0");
  spec.scoring = scoring_spec(reader("scoring"));
  spec.algorithm = algorithm_spec(reader("algorithm"), spec.scoring);
  spec.profiler = profiler_spec(reader("profiler"), spec.trainer.run_dir);
  return spec;
}

}  // namespace hybridflow
