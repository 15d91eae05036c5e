// RLTrainer's constructor: data and tokenizer, reward and cost scorers, resource pools and the worker
// groups of each role, with the settings each worker type reads.
#include "rl_batch_sizes.h"
#include "rl_trainer_state.h"
#include "score_guard.h"

#include "hybridflow/core/platform.h"
#include "hybridflow/engine/weight_sync.h"
#include "hybridflow/model/pretrained.h"
#include "hybridflow/placement/placement_spec.h"
#include "hybridflow/placement/workers_per_host.h"
#include "hybridflow/trainer/rl_program.h"
#include "hybridflow/trainer/rollout_sampling.h"
#include "hybridflow/parallel/resharding.h"

namespace hybridflow {

namespace {

// A role's verl optim keys (`section` names them in errors) as the worker's optimizer settings. The schedule
// advances once per RL step, as verl's: warm-up from 0 over lr_warmup_steps (or lr_warmup_steps_ratio x the
// total steps when negative), then constant or a cosine decay to min_lr_ratio x lr at total_training_steps.
nlohmann::json optim_json(const Config& optim, const std::string& section, int64_t total_steps) {
  const int64_t total = optim.is_null("total_training_steps") ? total_steps : optim.get<int64_t>("total_training_steps");
  HF_CHECK(total > 0, section, ".total_training_steps must be > 0 (or null: trainer.total_steps), got ", total);
  std::string kind = optim.get<std::string>("lr_scheduler_type");
  if (!optim.is_null("warmup_style")) {  // verl's older name; a config that sets both means the old one
    const std::string style = optim.get<std::string>("warmup_style");
    if (style != kind)
      log_warn(section, ".warmup_style = ", style, " (verl's deprecated name) overrides lr_scheduler_type = ", kind);
    kind = style;
  }
  HF_CHECK(kind == "constant" || kind == "cosine", section, ".lr_scheduler_type: expected constant | cosine (verl's), got '",
           kind, "'");
  const double ratio = optim.get<double>("lr_warmup_steps_ratio");
  HF_CHECK(ratio >= 0 && ratio <= 1, section, ".lr_warmup_steps_ratio must be in [0, 1], got ", ratio);
  const int64_t warmup = optim.get<int64_t>("lr_warmup_steps") >= 0
                             ? optim.get<int64_t>("lr_warmup_steps")
                             : static_cast<int64_t>(ratio * static_cast<double>(total));
  HF_CHECK(kind == "constant" || warmup < total, section, ": a cosine decay needs lr_warmup_steps (", warmup,
           ") < total_training_steps (", total, ")");
  const double min_lr_ratio = optim.get<double>("min_lr_ratio");
  HF_CHECK(min_lr_ratio >= 0 && min_lr_ratio <= 1, section, ".min_lr_ratio must be in [0, 1], got ", min_lr_ratio);
  return {{"lr", optim.get<double>("lr")},
          {"weight_decay", optim.get<double>("weight_decay")},
          {"grad_clip", optim.get<double>("grad_clip")},
          {"warmup_steps", warmup},
          {"warmup_from_zero", true},
          {"lr_schedule", kind},
          {"min_lr_ratio", min_lr_ratio},
          {"total_steps", total}};
}

// Numbers that would run silently wrong (or exit 0 having done nothing) fail here, before any worker starts.
// (Sampling settings are checked where they are resolved: rollout_sampling.cpp.)
void check_numbers(const Config& config) {
  const int64_t steps = config.get<int64_t>("trainer.total_steps");
  HF_CHECK(steps > 0, "trainer.total_steps must be > 0, got ", steps);
  const Config rollout = config.subtree("actor_rollout_ref.rollout");
  const int64_t response_length = rl_response_length(config);
  HF_CHECK(response_length > 0,
           rollout.is_null("response_length") ? "data.max_response_length" : "actor_rollout_ref.rollout.response_length",
           " must be > 0, got ", response_length);
  if (config.get<bool>("reward_model.overlong_buffer.enable")) {
    const int64_t len = config.get<int64_t>("reward_model.overlong_buffer.len");
    HF_CHECK(len > 0 && len <= response_length, "reward_model.overlong_buffer.len must be in (0, ", response_length,
             "] (the response budget) when the overlong buffer is enabled, got ", len);
  }
  reward_clip_from_config(config);
  for (const char* key : {"actor_rollout_ref.actor.ppo_epochs", "critic.ppo_epochs"}) {
    const int64_t v = config.get<int64_t>(key);
    HF_CHECK(v > 0, key, " must be > 0, got ", v);
  }
}

// A role's dtype key (null = `fallback`), normalised to fp32 | bf16 | fp16; the error names the full key.
std::string checked_dtype(const Config& c, const std::string& key, const std::string& full_key,
                          const std::string& fallback) {
  if (c.is_null(key)) return fallback;
  switch (parse_dtype(c.get<std::string>(key), full_key)) {
    case torch::kBFloat16: return "bf16";
    case torch::kFloat16: return "fp16";
    default: return "fp32";
  }
}

// verl's trainer.logger list. Its remote trackers are not built in: named, they are skipped with a warning,
// so a verl config runs unchanged; any other name is an error.
MetricsSinks metrics_sinks(const std::vector<std::string>& loggers, bool* console) {
  MetricsSinks sinks;
  sinks.jsonl = false;
  *console = false;
  for (const std::string& name : loggers) {
    if (name == "console") {
      *console = true;
    } else if (name == "jsonl") {
      sinks.jsonl = true;
    } else if (name == "tensorboard") {
      sinks.tensorboard = true;
    } else if (name == "wandb" || name == "mlflow" || name == "swanlab" || name == "vemlp_wandb" || name == "clearml") {
      log_warn("trainer.logger: '", name, "' is not built into hybridflow and is skipped; metrics go to ",
               "metrics.jsonl and TensorBoard (logger: [console, jsonl, tensorboard])");
    } else {
      HF_FAIL("trainer.logger: unknown logger '", name, "'; expected any of console, jsonl, tensorboard");
    }
  }
  return sinks;
}

// A role's training layout from verl's megatron keys under `section`, checked against its process count
// (named by `procs_key` in errors).
ParallelLayout role_layout(const Config& config, const std::string& section, int procs, const std::string& procs_key) {
  const std::string tp_key = section + ".megatron.tensor_model_parallel_size";
  const std::string pp_key = section + ".megatron.pipeline_model_parallel_size";
  const int tp = config.get<int>(tp_key);
  const int pp = config.get<int>(pp_key);
  HF_CHECK(tp >= 1, tp_key, " must be >= 1, got ", tp);
  HF_CHECK(pp >= 1, pp_key, " must be >= 1, got ", pp);
  HF_CHECK(procs % (tp * pp) == 0, procs_key, " = ", procs, " processes do not divide into model-parallel groups of ",
           tp_key, " = ", tp, " x ", pp_key, " = ", pp);
  ParallelLayout layout;
  layout.tp = tp;
  layout.pp = pp;
  return layout;
}

// The actor's layout adds generation's: a smaller tensor-parallel size switches through the 3D-HybridEngine.
// With a standalone rollout pool the rollout keys describe that pool, and the actor keeps its training layout.
ParallelLayout actor_layout(const Config& config, int procs, const std::string& procs_key, bool standalone_rollout) {
  ParallelLayout layout = role_layout(config, "actor_rollout_ref.actor", procs, procs_key);
  for (const auto& [ref_key, actor_value] :
       {std::pair<std::string, int>{"actor_rollout_ref.ref.megatron.tensor_model_parallel_size", layout.tp},
        std::pair<std::string, int>{"actor_rollout_ref.ref.megatron.pipeline_model_parallel_size", layout.pp}})
    HF_CHECK(config.is_null(ref_key) || config.get<int>(ref_key) == actor_value, ref_key, " = ",
             config.get<int>(ref_key), ": the reference model lives in the actor's processes and is split like the ",
             "actor (", actor_value, "); leave it null");
  if (standalone_rollout) {
    layout.gen_tp = layout.tp;
    layout.gen_pp = layout.pp;
    return layout;
  }
  const std::string gen_key = "actor_rollout_ref.rollout.tensor_model_parallel_size";
  layout.gen_tp = config.is_null(gen_key) ? layout.tp : config.get<int>(gen_key);
  HF_CHECK(layout.gen_tp >= 1 && layout.tp % layout.gen_tp == 0, gen_key, " = ", layout.gen_tp,
           " must divide actor_rollout_ref.actor.megatron.tensor_model_parallel_size = ", layout.tp,
           " (generation groups are made of parts of the training groups)");
  const std::string gen_pp_key = "actor_rollout_ref.rollout.pipeline_model_parallel_size";
  layout.gen_pp = config.get<int>(gen_pp_key);
  HF_CHECK(layout.gen_pp >= 1 && layout.pp % layout.gen_pp == 0, gen_pp_key, " = ", layout.gen_pp,
           " must divide actor_rollout_ref.actor.megatron.pipeline_model_parallel_size = ", layout.pp,
           " (a generation stage is made of consecutive training stages; 1 generates unstaged)");
  const std::string mode_key = "actor_rollout_ref.rollout.reshard_mode";
  ReshardMode mode;
  try {
    mode = parse_reshard_mode(config.get<std::string>(mode_key));
  } catch (const Error& e) {
    HF_FAIL(mode_key, ": ", e.what());
  }
  layout.consecutive_generation_groups = mode == ReshardMode::kHybridFlowV;
  HF_CHECK(layout.gen_pp == 1 || mode == ReshardMode::kHybridFlow || (layout.gen_pp == layout.pp && layout.gen_tp == layout.tp),
           gen_pp_key, " = ", layout.gen_pp, ": generation in pipeline stages switches layouts in ", mode_key,
           " = hybridflow only, got ", config.get<std::string>(mode_key));
  return layout;
}

// A standalone rollout pool's layout: rollout.tensor_model_parallel_size ranks per replica (null: 1), unstaged.
ParallelLayout standalone_rollout_layout(const Config& config, int procs, const std::string& procs_key) {
  const std::string tp_key = "actor_rollout_ref.rollout.tensor_model_parallel_size";
  const std::string pp_key = "actor_rollout_ref.rollout.pipeline_model_parallel_size";
  ParallelLayout layout;
  layout.tp = config.is_null(tp_key) ? 1 : config.get<int>(tp_key);
  HF_CHECK(layout.tp >= 1, tp_key, " must be >= 1, got ", layout.tp);
  HF_CHECK(config.get<int>(pp_key) == 1, pp_key, " = ", config.get<int>(pp_key),
           ": a standalone rollout pool generates unstaged; leave it 1");
  HF_CHECK(procs % layout.tp == 0, procs_key, " = ", procs, " processes do not divide into generation replicas of ",
           tp_key, " = ", layout.tp);
  return layout;
}

// Generated examples of the built-in task as data rows, named in errors by split and index. Their
// data_source is the task's name, as a verl file made from the task (hybridflow data) would have it.
std::vector<PromptRow> task_rows(const Task& task, const std::vector<Example>& examples, const std::string& split) {
  std::vector<PromptRow> rows;
  rows.reserve(examples.size());
  for (size_t i = 0; i < examples.size(); ++i) {
    PromptRow row;
    row.prompt = examples[i].prompt;
    row.answer = examples[i].answer;
    row.data_source = task.name();
    row.where = "data.task '" + task.name() + "': generated " + split + " example " + std::to_string(i);
    rows.push_back(std::move(row));
  }
  return rows;
}

// Every prompt plus the response budget must fit the model's positions: past max_position_embeddings the
// rotary embedding is extrapolated and the output is noise, and memory grows with the length. Checked on
// the prompts as loaded (after data.max_prompt_length), before any worker starts.
void check_context_fits(const Config& config, const std::string& model_path, int64_t vocab_size,
                        const std::vector<std::pair<std::string, const std::vector<EncodedPrompt>*>>& sets) {
  const ModelConfig model = model_path.empty()
                                ? preset_model_config(config.get<std::string>("model.preset"), vocab_size)
                                : load_model_config(model_path + "/config.json");
  const std::string model_source =
      model_path.empty() ? "model.preset '" + config.get<std::string>("model.preset") + "'" : model_path + "/config.json";
  const int64_t limit = model.max_position_embeddings;
  const int64_t response = rl_response_length(config);
  const std::string response_key = config.is_null("actor_rollout_ref.rollout.response_length")
                                       ? "data.max_response_length"
                                       : "actor_rollout_ref.rollout.response_length";
  HF_CHECK(response < limit, response_key, " = ", response, " leaves no room for a prompt in the model's ",
           "max_position_embeddings = ", limit, " (", model_source, ")");
  for (const auto& [source, prompts] : sets) {
    size_t longest = 0;
    for (size_t i = 1; i < prompts->size(); ++i)
      if ((*prompts)[i].ids.size() > (*prompts)[longest].ids.size()) longest = i;
    if (prompts->empty()) continue;
    const auto length = static_cast<int64_t>((*prompts)[longest].ids.size());
    HF_CHECK(length + response <= limit, source, ": the longest prompt (no. ", longest + 1, " as loaded) is ", length, " tokens and ", response_key,
             " = ", response, ", so its sequence needs ", length + response,
             " positions, more than the model's max_position_embeddings = ", limit, " (", model_source,
             "); lower data.max_prompt_length to at most ", limit - response,
             " (longer prompts are then cut by data.truncation or dropped by data.filter_overlong_prompts) or ",
             response_key);
  }
}

// One-step off-policy prefetches a step's one sampled generation while the previous step trains; programs
// that generate again inside a step (DAPO's rounds, ReMax's greedy baseline) would mix policies in one step.
void check_staleness_fits_program(const RolePlacement& placement, const std::string& program,
                                  const std::string& estimator) {
  if (placement.staleness == 0) return;
  HF_CHECK(program != "dapo" && estimator != "remax", "actor_rollout_ref.rollout.staleness: 1 generates each step's ",
           "rollout during the previous step, but ", program == "dapo" ? "program dapo generates several rounds per step"
                                                                       : "adv_estimator remax generates a greedy baseline",
           " with the current weights; use staleness 0 with it");
}

nlohmann::json nullable(const Config& c, const std::string& key) {
  return c.is_null(key) ? nlohmann::json() : nlohmann::json(c.get<double>(key));
}

}  // namespace

RLTrainer::RLTrainer(const Config& config) : s_(std::make_unique<State>()) {
  State& s = *s_;
  s.cfg = config;
  check_numbers(config);
  const std::string run_dir = config.get<std::string>("trainer.run_dir");
  if (!run_dir.empty()) {
    s.run_dir_lock = std::make_unique<DirectoryLock>(run_dir);
    // The resolved config (defaults, file and overrides) beside the metrics from the start, not only in
    // checkpoints: what a run directory was made with is then never a guess.
    write_file_atomic(run_dir + "/config.yaml", config.to_yaml());
  }
  register_rl_workers();
  // Before any worker starts, so that a bad resume path fails at once.
  const std::string resume_dir = checkpoint_to_resume(config.subtree("trainer"));
  HF_CHECK(!(config.get<bool>("trainer.save_checkpoint") || config.get<int64_t>("trainer.save_freq") > 0) ||
               !config.get<std::string>("trainer.run_dir").empty(),
           "trainer.save_checkpoint / trainer.save_freq need trainer.run_dir (checkpoints go to <run_dir>/checkpoints)");
  const Config algorithm = config.subtree("algorithm");
  s.adv_estimator = algo::advantage_estimator_name(algorithm);
  s.program = rl_program_name(config);
  check_rl_program(s.program, config);  // what the program needs of the configuration, before any worker starts
  s.use_critic = s.adv_estimator == "gae";  // grpo / rloo / reinforce++ / remax need no value function
  const bool use_kl_loss = config.get<bool>("actor_rollout_ref.actor.use_kl_loss");
  const bool kl_in_reward = config.get<bool>("algorithm.use_kl_in_reward");
  s.need_ref = use_kl_loss || kl_in_reward;
  // verl's bypass mode replaces the policy loss with its PPO clip (rollout_correction.loss_type ppo_clip), which
  // is hybridflow's vanilla loss with the rollout as the old policy.
  HF_CHECK(!config.get<bool>("algorithm.rollout_correction.bypass_mode") ||
               config.get<std::string>("actor_rollout_ref.actor.policy_loss.loss_mode") == "vanilla",
           "algorithm.rollout_correction.bypass_mode: true trains with PPO's clipped loss (verl's ppo_clip); ",
           "actor_rollout_ref.actor.policy_loss.loss_mode must be vanilla, got ",
           config.get<std::string>("actor_rollout_ref.actor.policy_loss.loss_mode"));
  s.kl_ctrl = algo::kl_controller(algorithm);

  // Data and tokenizer.
  TaskOptions task_options;
  task_options.min_digits = config.get<int>("data.min_digits");
  task_options.max_digits = config.get<int>("data.max_digits");
  s.task = make_task(config.get<std::string>("data.task"), task_options);
  const std::string model_path = config.get<std::string>("model.path");
  s.tokenizer = model_path.empty() ? Tokenizer::from_alphabet(s.task->alphabet())
                                   : Tokenizer::load(model_path + "/tokenizer.json");
  const uint64_t seed = static_cast<uint64_t>(config.get<int64_t>("trainer.seed"));
  const std::string train_file = config.get<std::string>("data.train_file");
  const std::string test_file = config.get<std::string>("data.test_file");
  PromptEncoder encoder(s.tokenizer, model_path, PromptOptions::from_config(config));
  std::vector<PromptRow> train_rows, test_rows;
  if (!test_file.empty()) test_rows = read_prompt_rows(test_file);
  if (train_file.empty() || test_file.empty()) {
    auto splits = make_splits(*s.task, config.get<int64_t>("data.train_size"), config.get<int64_t>("data.test_size"), seed);
    if (!test_file.empty()) {  // no held-out leak: generated training prompts that the test file holds go
      std::vector<Example> held_out;
      for (const auto& row : test_rows)
        if (!row.is_chat()) held_out.push_back({row.prompt, row.answer});
      drop_prompts_of(held_out, &splits.train);
    }
    train_rows = task_rows(*s.task, splits.train, "training");
    if (test_file.empty()) test_rows = task_rows(*s.task, splits.test, "test");
  }
  if (!train_file.empty()) train_rows = read_prompt_rows(train_file);
  s.train = encoder.encode(train_rows, train_file.empty() ? "data.task '" + s.task->name() + "'" : train_file);
  s.test = encoder.encode(test_rows, test_file.empty() ? "data.task '" + s.task->name() + "'" : test_file);
  check_context_fits(config, model_path, s.tokenizer.vocab_size(),
                     {{train_file.empty() ? "data.task '" + s.task->name() + "'" : train_file, &s.train},
                      {test_file.empty() ? "data.task '" + s.task->name() + "'" : test_file, &s.test}});
  const int64_t batch_prompts = config.get<int64_t>("data.train_batch_size");
  HF_CHECK(batch_prompts > 0 && static_cast<int64_t>(s.train.size()) >= batch_prompts, "data.train_batch_size: ",
           batch_prompts, " prompts per step need at least that many training examples, have ", s.train.size());

  const std::string reward_type = config.get<std::string>("reward.type");
  if (reward_type != "task" && reward_type != "none") s.reward_fn = make_reward_function(config.subtree("reward"));
  const std::string cost_type = config.get<std::string>("cost.type");
  HF_CHECK(cost_type == "none" || cost_type == "contains" || cost_type == "command" || cost_type == "http",
           "cost.type: expected none | contains | command | http, got '", cost_type, "'");
  if (cost_type == "command" || cost_type == "http") s.cost_fn = make_reward_function(config.subtree("cost"));
  HF_CHECK(cost_type != "contains" || !config.get<std::vector<std::string>>("cost.contains").empty(),
           "cost.type contains needs a non-empty cost.contains list of strings");
  const bool use_cost_model = config.get<bool>("cost_model.enable");
  if (use_cost_model || cost_type != "none") s.lagrange.emplace(algo::lagrange_config(algorithm));

  s.sinks = metrics_sinks(config.get<std::vector<std::string>>("trainer.logger"), &s.console_log);

  const RolloutSampling sampling =
      resolve_rollout_sampling(config.subtree("actor_rollout_ref.rollout"), model_path, s.tokenizer.eos_id());
  if (sampling.source != "config")
    log_info("rollout sampling from ", sampling.source, ": temperature ", sampling.temperature, ", top_k ",
             sampling.top_k, ", top_p ", sampling.top_p);

  // Worker groups and their processes.
  const int64_t total_steps = config.get<int64_t>("trainer.total_steps");
  const int threads = config.get<int>("trainer.threads_per_worker");
  nlohmann::json model_spec = {{"path", model_path},
                               {"device", resolve_device_name(config.get<std::string>("trainer.device"), "trainer.device")},
                               {"preset", config.get<std::string>("model.preset")},
                               {"vocab_size", s.tokenizer.vocab_size()},
                               {"init_seed", config.get<int64_t>("model.init_seed")},
                               {"eos_token_id", s.tokenizer.eos_id()},
                               {"eos_token_ids", sampling.eos_token_ids},
                               {"pad_token_id", s.tokenizer.pad_id()}};
  for (const char* dim : {"hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads",
                          "num_key_value_heads"})
    model_spec[dim] = config.get<int64_t>(std::string("model.") + dim);

  const Config actor = config.subtree("actor_rollout_ref.actor");
  const Config rollout = config.subtree("actor_rollout_ref.rollout");
  // Which pool each role runs in (placement/placement_spec.h): checked here, before any process starts.
  const bool use_rm = config.get<bool>("reward_model.enable");
  std::vector<std::string> run_roles = {"actor"};
  if (s.use_critic) run_roles.push_back("critic");
  if (s.use_critic && s.lagrange) run_roles.push_back("cost_critic");
  if (use_rm) run_roles.push_back("reward_model");
  if (use_cost_model) run_roles.push_back("cost_model");
  s.placement = resolve_placement(config, run_roles);
  check_staleness_fits_program(s.placement, s.program, s.adv_estimator);
  {
    const int64_t nnodes = config.is_null("trainer.nnodes") ? 1 : config.get<int64_t>("trainer.nnodes");
    const int per_host = workers_per_host(s.placement, nnodes, launch_env_from_environment());
    if (per_host > 0)
      model_spec["device"] = device_for_processes(model_spec["device"].get<std::string>(),
                                                  config.get<std::string>("trainer.device"), per_host,
                                                  static_cast<int64_t>(torch::cuda::device_count()), "trainer.device",
                                                  describe_placement(s.placement));
  }
  const bool standalone = s.placement.standalone_rollout();
  const PoolSpec& actor_pool = s.placement.pool_of("actor");
  const int actor_procs = actor_pool.processes;
  const int64_t n = rollout.get<int64_t>("n");
  HF_CHECK(n >= 1, "actor_rollout_ref.rollout.n must be >= 1, got ", n);
  // Group baselines need a group: with one sample per prompt every GRPO/RLOO advantage is 0.
  HF_CHECK(n >= 2 || (s.adv_estimator != "grpo" && s.adv_estimator != "rloo"), "algorithm.adv_estimator=",
           s.adv_estimator, " compares the samples of a prompt, so actor_rollout_ref.rollout.n must be >= 2, got ", n,
           " (with n = 1 every advantage is 0 and nothing is learned)");
  const ParallelLayout actor_mesh = actor_layout(config, actor_procs, actor_pool.processes_key, standalone);
  const int actor_dp = actor_procs / (actor_mesh.tp * actor_mesh.pp);
  // Each generation replica is gen_pp stages of gen_tp ranks.
  const int gen_replicas = actor_procs / (actor_mesh.gen_tp * actor_mesh.gen_pp);
  HF_CHECK((batch_prompts * n) % actor_dp == 0, "data.train_batch_size x rollout.n = ", batch_prompts * n,
           " samples must divide across the actor's ", actor_dp, " data-parallel groups (", actor_pool.processes_key, " = ",
           actor_procs, " / (tensor_model_parallel_size = ", actor_mesh.tp, " x pipeline_model_parallel_size = ",
           actor_mesh.pp, "))");
  HF_CHECK(standalone || batch_prompts % gen_replicas == 0, "data.train_batch_size = ", batch_prompts,
           " prompts must divide across the actor's ", gen_replicas, " generation replicas (", actor_pool.processes_key, " = ",
           actor_procs, " / (rollout.tensor_model_parallel_size = ", actor_mesh.gen_tp,
           " x rollout.pipeline_model_parallel_size = ", actor_mesh.gen_pp, "))");
  nlohmann::json actor_json = optim_json(actor.subtree("optim"), "actor_rollout_ref.actor.optim", total_steps);
  // verl's batch semantics (rl_batch_sizes.h); 8 samples per process per micro-batch when neither key is set.
  const int64_t actor_mini = mini_batch_rows_per_process(config, "actor_rollout_ref.actor.ppo_mini_batch_size", n, actor_dp);
  const int64_t actor_micro =
      micro_batch_rows_per_process(config, "actor_rollout_ref.actor.ppo_micro_batch_size", actor_dp, 8);
  check_micro_divides_mini(actor_mini, actor_micro, "actor_rollout_ref.actor.ppo_mini_batch_size",
                           "actor_rollout_ref.actor.ppo_micro_batch_size(_per_gpu)");
  // Log-prob passes: 16 samples per process when unset; the reference defaults to the rollout's setting.
  const int64_t log_prob_micro =
      micro_batch_rows_per_process(config, "actor_rollout_ref.rollout.log_prob_micro_batch_size", actor_dp, 16);
  const int64_t ref_log_prob_micro =
      micro_batch_rows_per_process(config, "actor_rollout_ref.ref.log_prob_micro_batch_size", actor_dp, log_prob_micro);
  // Dynamic batch size (verl's keys): micro-batches by token count. The rollout's and the reference's
  // log-prob passes, and the critic's (and through it the reward model's), inherit the actor's switch.
  const DynamicBsz actor_bsz = dynamic_bsz(config, "actor_rollout_ref.actor.use_dynamic_bsz", false,
                                           "actor_rollout_ref.actor.ppo_max_token_len_per_gpu", 0);
  const DynamicBsz log_prob_bsz =
      dynamic_bsz(config, "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz", actor_bsz.on,
                  "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu", actor_bsz.max_tokens);
  const DynamicBsz ref_log_prob_bsz =
      dynamic_bsz(config, "actor_rollout_ref.ref.log_prob_use_dynamic_bsz", actor_bsz.on,
                  "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu", actor_bsz.max_tokens);
  const DynamicBsz critic_bsz =
      dynamic_bsz(config, "critic.use_dynamic_bsz", actor_bsz.on, "critic.ppo_max_token_len_per_gpu", 0);
  const DynamicBsz critic_forward_bsz =
      dynamic_bsz(config, "critic.use_dynamic_bsz", actor_bsz.on, "critic.forward_max_token_len_per_gpu",
                  critic_bsz.max_tokens);
  const DynamicBsz rm_bsz = dynamic_bsz(config, "reward_model.use_dynamic_bsz", critic_bsz.on,
                                        "reward_model.forward_max_token_len_per_gpu", critic_forward_bsz.max_tokens);
  actor_json.update({{"mini_batch_rows", actor_mini},
                     {"micro_batch_rows", actor_micro},
                     {"max_token_len", actor_bsz.budget()},
                     {"epochs", actor.get<int64_t>("ppo_epochs")},
                     {"shuffle", actor.get<bool>("shuffle")},
                     {"seed", seed},
                     {"clip_ratio", actor.get<double>("clip_ratio")},
                     {"clip_ratio_low", nullable(actor, "clip_ratio_low")},
                     {"clip_ratio_high", nullable(actor, "clip_ratio_high")},
                     {"clip_ratio_c", actor.get<double>("clip_ratio_c")},
                     {"loss_agg_mode", actor.get<std::string>("loss_agg_mode")},
                     {"loss_scale_factor", nullable(actor, "loss_scale_factor")},
                     {"policy_loss", {{"loss_mode", actor.get<std::string>("policy_loss.loss_mode")}}},
                     {"entropy_coeff", actor.get<double>("entropy_coeff")},
                     {"use_kl_loss", use_kl_loss},
                     {"kl_loss_coef", actor.get<double>("kl_loss_coef")},
                     {"kl_loss_type", actor.get<std::string>("kl_loss_type")},
                     {"use_distributed_optimizer", actor.get<bool>("megatron.use_distributed_optimizer")}});
  // Per-role dtypes: the actor trains and computes old log-probs in actor.dtype; generation and the
  // reference default to the actor's. All are validated here, so a typo fails before any process starts.
  const std::string actor_dtype = checked_dtype(actor, "dtype", "actor_rollout_ref.actor.dtype", "fp32");
  const std::string ref_dtype =
      checked_dtype(config.subtree("actor_rollout_ref.ref"), "dtype", "actor_rollout_ref.ref.dtype", actor_dtype);
  const std::string critic_dtype = checked_dtype(config.subtree("critic"), "dtype", "critic.dtype", "fp32");
  const std::string rm_dtype = checked_dtype(config.subtree("reward_model"), "dtype", "reward_model.dtype", "fp32");
  const std::string cm_dtype = checked_dtype(config.subtree("cost_model"), "dtype", "cost_model.dtype", "fp32");
  actor_json["dtype"] = actor_dtype;
  model_spec["dtype"] = actor_dtype;
  const int64_t max_num_seqs = rollout.get<int64_t>("max_num_seqs");
  HF_CHECK(max_num_seqs >= 0, "actor_rollout_ref.rollout.max_num_seqs must be >= 0 (0 = every sequence at once), got ",
           max_num_seqs);
  const std::string rollout_dtype = checked_dtype(rollout, "dtype", "actor_rollout_ref.rollout.dtype", actor_dtype);
  nlohmann::json rollout_json = {{"dtype", standalone ? actor_dtype : rollout_dtype},
                                 {"n", n},
                                 {"temperature", sampling.temperature},
                                 {"top_k", sampling.top_k},
                                 {"top_p", sampling.top_p},
                                 {"response_length", rl_response_length(config)},
                                 {"log_prob_micro_batch_size", log_prob_micro},
                                 {"ref_log_prob_micro_batch_size", ref_log_prob_micro},
                                 {"log_prob_max_token_len", log_prob_bsz.budget()},
                                 {"ref_log_prob_max_token_len", ref_log_prob_bsz.budget()},
                                 {"seed", seed},
                                 {"tensor_model_parallel_size", actor_mesh.gen_tp},
                                 {"pipeline_model_parallel_size", actor_mesh.gen_pp},
                                 {"reshard_mode", rollout.get<std::string>("reshard_mode")},
                                 {"free_cache_engine", rollout.get<bool>("free_cache_engine")},
                                 {"max_num_seqs", max_num_seqs}};
  actor_json["offload"] = {{"param_offload", actor.get<bool>("fsdp_config.param_offload")},
                           {"optimizer_offload", actor.get<bool>("fsdp_config.optimizer_offload")}};

  int local_ranks_taken = 0;  // pools on this node take disjoint LOCAL_RANKs, so disjoint GPUs
  auto pool_spec = [&](const std::string& name, int procs) {
    ResourcePool spec;
    spec.name = name;
    spec.num_processes = procs;
    spec.local_rank_offset = local_ranks_taken;
    local_ranks_taken += procs;
    spec.env["OMP_NUM_THREADS"] = std::to_string(threads);
    spec.env["OMP_WAIT_POLICY"] = "passive";
    return spec;
  };
  // Every role's layout is checked against its pool before any process starts.
  auto layout_of = [&](const std::string& role) {
    const PoolSpec& pool = s.placement.pool_of(role);
    return role_layout(config, role, pool.processes, pool.processes_key);
  };
  auto dp_of = [&](const std::string& role, const ParallelLayout& mesh) {
    return s.placement.pool_of(role).processes / (mesh.tp * mesh.pp);
  };
  const ParallelLayout critic_mesh = s.use_critic ? layout_of("critic") : ParallelLayout{};
  const int critic_dp = s.use_critic ? dp_of("critic", critic_mesh) : 1;
  HF_CHECK(!s.use_critic || (batch_prompts * n) % critic_dp == 0, "data.train_batch_size x rollout.n = ",
           batch_prompts * n, " samples must divide across the critic's ", critic_dp, " data-parallel groups");
  if (s.use_critic && s.lagrange) {  // the cost critic takes the critic's sizes, on its own pool
    const PoolSpec& pool = s.placement.pool_of("cost_critic");
    role_layout(config, "critic", pool.processes, pool.processes_key);
  }
  const ParallelLayout rm_mesh = use_rm ? layout_of("reward_model") : ParallelLayout{};
  const ParallelLayout cm_mesh = use_cost_model ? layout_of("cost_model") : ParallelLayout{};
  const int rm_dp = use_rm ? dp_of("reward_model", rm_mesh) : 1;
  const int cm_dp = use_cost_model ? dp_of("cost_model", cm_mesh) : 1;
  ParallelLayout rollout_mesh;
  if (standalone) {
    const PoolSpec& pool = s.placement.pool_of("rollout");
    rollout_mesh = standalone_rollout_layout(config, pool.processes, pool.processes_key);
    const int replicas = pool.processes / rollout_mesh.tp;
    HF_CHECK(batch_prompts % replicas == 0, "data.train_batch_size = ", batch_prompts,
             " prompts must divide across the rollout pool's ", replicas, " generation replicas (", pool.processes_key,
             " = ", pool.processes, " / rollout.tensor_model_parallel_size = ", rollout_mesh.tp, ")");
  }
  log_info("placement ", s.placement.kind, (standalone ? ", staleness " + std::to_string(s.placement.staleness) : ""),
           ":\n", describe_placement(s.placement));
  std::vector<ResourcePool> pools;
  for (const PoolSpec& pool : s.placement.pools) pools.push_back(pool_spec(pool.name, pool.processes));
  s.controller.add_pools(pools);

  // Activation checkpointing is per role (verl's <role>.model.enable_gradient_checkpointing); it only acts
  // where a model trains.
  nlohmann::json actor_spec = model_spec;
  actor_spec["enable_gradient_checkpointing"] = config.get<bool>("actor_rollout_ref.model.enable_gradient_checkpointing");
  s.actor = std::make_unique<WorkerGroup>(s.controller.create_group(
      actor_pool.name, "actor", kActorRolloutRefWorkerType, actor_mesh,
      {{"model", actor_spec}, {"has_ref", s.need_ref}, {"threads", threads}, {"actor", actor_json}, {"rollout", rollout_json},
       {"ref_dtype", ref_dtype}}));
  if (s.use_critic) {
    const Config critic = config.subtree("critic");
    const std::string critic_path = critic.get<std::string>("model_path");
    nlohmann::json critic_spec = model_spec;
    if (!critic_path.empty()) critic_spec["path"] = critic_path;
    critic_spec["dtype"] = critic_dtype;
    critic_spec["enable_gradient_checkpointing"] = critic.get<bool>("model.enable_gradient_checkpointing");
    nlohmann::json critic_json = optim_json(critic.subtree("optim"), "critic.optim", total_steps);
    const int64_t critic_mini = mini_batch_rows_per_process(config, "critic.ppo_mini_batch_size", n, critic_dp);
    const int64_t critic_micro = micro_batch_rows_per_process(config, "critic.ppo_micro_batch_size", critic_dp, 8);
    check_micro_divides_mini(critic_mini, critic_micro, "critic.ppo_mini_batch_size", "critic.ppo_micro_batch_size(_per_gpu)");
    // The values pass: verl's forward_micro_batch_size keys, defaulting to the training micro-batch.
    const int64_t critic_forward_micro =
        micro_batch_rows_per_process(config, "critic.forward_micro_batch_size", critic_dp, critic_micro);
    critic_json["offload"] = {{"param_offload", critic.get<bool>("model.fsdp_config.param_offload")},
                              {"optimizer_offload", critic.get<bool>("model.fsdp_config.optimizer_offload")}};
    critic_json.update({{"mini_batch_rows", critic_mini},
                        {"micro_batch_rows", critic_micro},
                        {"max_token_len", critic_bsz.budget()},
                        {"epochs", critic.get<int64_t>("ppo_epochs")},
                        {"shuffle", critic.get<bool>("shuffle")},
                        {"seed", seed + 1},
                        {"cliprange_value", critic.get<double>("cliprange_value")},
                        {"loss_agg_mode", critic.get<std::string>("loss_agg_mode")},
                        {"use_distributed_optimizer", critic.get<bool>("megatron.use_distributed_optimizer")}});
    s.critic = std::make_unique<WorkerGroup>(s.controller.create_group(
        s.placement.pool_of("critic").name, "critic", kCriticWorkerType, critic_mesh,
        {{"model", critic_spec}, {"threads", threads}, {"critic", critic_json},
         {"log_prob_micro_batch_size", critic_forward_micro}, {"forward_max_token_len", critic_forward_bsz.budget()}}));
    if (s.lagrange) {  // Safe-RLHF's cost critic: the critic's settings, its own weights and data order
      critic_json["seed"] = seed + 2;
      s.cost_critic = std::make_unique<WorkerGroup>(s.controller.create_group(
          s.placement.pool_of("cost_critic").name, "cost_critic", kCriticWorkerType, critic_mesh,
          {{"model", critic_spec}, {"threads", threads}, {"critic", critic_json},
           {"log_prob_micro_batch_size", critic_forward_micro}, {"forward_max_token_len", critic_forward_bsz.budget()}}));
    }
  }
  if (use_rm) {
    nlohmann::json rm_spec = model_spec;
    rm_spec["path"] = config.get<std::string>("reward_model.path");
    rm_spec["dtype"] = rm_dtype;
    s.reward_model = std::make_unique<WorkerGroup>(s.controller.create_group(
        s.placement.pool_of("reward_model").name, "reward_model", kRewardModelWorkerType,
        rm_mesh,
        {{"model", rm_spec}, {"threads", threads}, {"micro_batch_size", micro_batch_rows_per_process(config, "reward_model.micro_batch_size", rm_dp, 16)},
         {"max_token_len", rm_bsz.budget()}}));
  }
  if (use_cost_model) {  // a value-head model like the reward model, under its own role
    nlohmann::json cm_spec = model_spec;
    cm_spec["path"] = config.get<std::string>("cost_model.path");
    cm_spec["dtype"] = cm_dtype;
    s.cost_model = std::make_unique<WorkerGroup>(s.controller.create_group(
        s.placement.pool_of("cost_model").name, "cost_model", kRewardModelWorkerType,
        cm_mesh,
        {{"model", cm_spec}, {"threads", threads}, {"micro_batch_size", micro_batch_rows_per_process(config, "cost_model.micro_batch_size", cm_dp, 16)},
         {"max_token_len", rm_bsz.budget()}}));  // the reward model's dynamic batch size
  }
  if (standalone) {  // generation on its own pool, from a shadow copy of the actor's weights
    nlohmann::json rollout_spec = model_spec;
    rollout_spec["dtype"] = rollout_dtype;
    nlohmann::json standalone_json = rollout_json;
    standalone_json["dtype"] = rollout_dtype;
    standalone_json["tensor_model_parallel_size"] = rollout_mesh.tp;
    standalone_json["pipeline_model_parallel_size"] = 1;
    s.rollout = std::make_unique<WorkerGroup>(s.controller.create_group(
        s.placement.pool_of("rollout").name, "rollout", kRolloutWorkerType, rollout_mesh,
        {{"model", rollout_spec}, {"threads", threads}, {"rollout", standalone_json}}));
  }
  for (WorkerGroup* g : {s.actor.get(), s.rollout.get(), s.critic.get(), s.cost_critic.get(), s.reward_model.get(),
                         s.cost_model.get()})
    if (g) g->record_calls(s.timeline);
  s.metrics = std::make_unique<MetricsLog>(config.get<std::string>("trainer.run_dir"), s.sinks);
  if (standalone) {
    WeightSyncLayout link;
    link.actor_tp = actor_mesh.tp;
    link.actor_pp = actor_mesh.pp;
    link.actor_dp = actor_dp;
    link.rollout_tp = rollout_mesh.tp;
    link.rollout_replicas = s.placement.pool_of("rollout").processes / rollout_mesh.tp;
    s.connect_weight_sync(link, rollout.get<int64_t>("update_weights_bucket_megabytes"), rollout_dtype);
  }
  if (!resume_dir.empty()) s.resume(resume_dir);
  // The rollout pool starts from the actor's weights (fresh or resumed), whatever it built itself.
  if (standalone) s.sync_rollout_weights();
}

}  // namespace hybridflow
