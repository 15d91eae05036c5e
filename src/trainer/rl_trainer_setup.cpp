// RLTrainer's constructor: a sequence of named steps. The run's spec (trainer/run_spec_builders.h: every
// trainer, data, algorithm and scoring key is read there), the run directory and its settings; the data and
// tokenizer; the reward and cost scorers; which roles run; the placement of their pools; each role's spec
// (trainer/role_spec_builders.h: every role key is read there); the worker groups; and the resume.
#include <algorithm>
#include <numeric>

#include "role_spec_builders.h"
#include "rl_trainer_state.h"
#include "score_guard.h"

#include "hybridflow/core/platform.h"
#include "hybridflow/engine/weight_sync.h"
#include "hybridflow/model/model_size.h"
#include "hybridflow/model/pretrained.h"
#include "hybridflow/workers/model_spec.h"
#include "hybridflow/placement/placement_spec.h"
#include "hybridflow/placement/workers_per_host.h"
#include "hybridflow/trainer/rl_program.h"

namespace hybridflow {

namespace {

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
void check_context_fits(const ModelSpec& model_spec, const ModelConfig& model, int64_t response,
                        const std::string& response_key,
                        const std::vector<std::pair<std::string, const std::vector<EncodedPrompt>*>>& sets) {
  const std::string model_source =
      model_spec.path.empty() ? "model.preset '" + model_spec.preset + "'" : model_spec.path + "/config.json";
  const int64_t limit = model.max_position_embeddings;
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

// Off-policy prefetches a step's one sampled generation while earlier steps train; programs that generate
// again inside a step (DAPO's rounds, ReMax's greedy baseline) would mix policies in one step.
void check_staleness_fits_program(const RolePlacement& placement, const std::string& program,
                                  const std::string& estimator) {
  if (placement.staleness == 0) return;
  HF_CHECK(program != "dapo" && estimator != "remax", "actor_rollout_ref.rollout.staleness: ", placement.staleness,
           " generates each step's rollout during earlier steps, but ", program == "dapo" ? "program dapo generates several rounds per step"
                                                                       : "adv_estimator remax generates a greedy baseline",
           " with the current weights; use staleness 0 with it");
}

// A restart replaces the rollout's processes, so they must hold nothing else: a standalone rollout pool of
// its own (the actor generating is a trainer rank, whose death stops the run).
void check_rollout_restarts_fit_placement(const RolePlacement& placement, int64_t max_restarts) {
  if (max_restarts == 0) return;
  HF_CHECK(placement.standalone_rollout(), "trainer.max_rollout_restarts: ", max_restarts, " restarts a standalone ",
           "rollout pool whose workers died, but this run has none (placement ", placement.kind, ": the actor ",
           "generates); use trainer.placement: standalone or a pools: entry with the rollout alone, or set it to 0");
  const PoolSpec& pool = placement.pool_of("rollout");
  HF_CHECK(pool.roles == std::vector<std::string>{"rollout"}, "trainer.max_rollout_restarts: ", max_restarts,
           " restarts the rollout's pool, but pool '", pool.name, "' also holds other roles, whose state a restart ",
           "would lose; give the rollout a pool of its own or set trainer.max_rollout_restarts to 0");
}

// Where the data came from, for errors: the file, or the built-in task.
std::string prompts_source(const Task& task, const std::vector<std::string>& files) {
  if (files.empty()) return "data.task '" + task.name() + "'";
  std::string joined;
  for (const auto& f : files) joined += (joined.empty() ? "" : ", ") + f;
  return joined;
}

}  // namespace

// The run's spec, the run directory (locked, with the resolved config) and the metrics sinks;
// returns the checkpoint to resume from ("" for a fresh start), resolved before any worker starts so that a
// bad resume path fails at once.
std::string RLTrainer::State::open_run() {
  State& s = *this;
  const Config& config = s.cfg;
  s.run = build_run_spec(config);
  const std::string& run_dir = s.run.trainer.run_dir;
  if (!run_dir.empty() && !s.dry_run) {
    s.run_dir_lock = std::make_unique<DirectoryLock>(run_dir);
    // The resolved config (defaults, file and overrides) beside the metrics from the start, not only in
    // checkpoints: what a run directory was made with is then never a guess.
    write_file_atomic(run_dir + "/config.yaml", config.to_yaml());
  }
  register_rl_workers();
  const std::string resume_dir = checkpoint_to_resume(s.run.trainer);
  if (!s.dry_run) s.sinks = metrics_sinks(s.run.trainer.logger, &s.console_log);
  return resume_dir;
}

// The task, the tokenizer (the model directory's, or the task's alphabet for a preset) and the encoded
// training and test prompts; the model spec every role starts from gets the tokenizer's ids.
namespace {

// data.train_max_samples as verl's dataset applies it: with shuffling a seeded random subset (kept in the
// file's order: the epochs shuffle it), without the first `max` rows. max <= 0: every row.
std::vector<PromptRow> at_most_rows(std::vector<PromptRow> rows, int64_t max, bool shuffle, uint64_t seed) {
  if (max <= 0 || static_cast<int64_t>(rows.size()) <= max) return rows;
  std::vector<int64_t> keep(rows.size());
  std::iota(keep.begin(), keep.end(), 0);
  if (shuffle) keep = seeded_permutation(static_cast<int64_t>(rows.size()), seed * 1000003ULL + 0x5eedULL);
  keep.resize(static_cast<size_t>(max));
  std::sort(keep.begin(), keep.end());
  std::vector<PromptRow> out;
  out.reserve(keep.size());
  for (int64_t i : keep) out.push_back(std::move(rows[static_cast<size_t>(i)]));
  return out;
}

}  // namespace

void RLTrainer::State::load_data() {
  State& s = *this;
  const Config& config = s.cfg;
  TaskOptions task_options;
  const DataSpec& data = s.run.data;
  task_options.min_digits = data.min_digits;
  task_options.max_digits = data.max_digits;
  task_options.min_length = data.min_length;
  task_options.max_length = data.max_length;
  s.task = make_task(data.task, task_options);
  s.model = model_spec_from_config(config);
  const std::string model_path = s.model.path;
  s.tokenizer = model_path.empty() ? Tokenizer::from_alphabet(s.task->alphabet())
                                   : Tokenizer::load(model_path + "/tokenizer.json");
  s.model.vocab_size = s.tokenizer.vocab_size();
  s.model.eos_token_id = s.tokenizer.eos_id();
  s.model.pad_token_id = s.tokenizer.pad_id();
  const uint64_t seed = s.run.trainer.seed;
  const std::vector<std::string>& train_files = data.train_files;
  const std::vector<std::string>& test_files = data.test_files;
  s.prompt_options = PromptOptions::from_config(config);
  PromptEncoder encoder(s.tokenizer, model_path, s.prompt_options);
  std::vector<PromptRow> train_rows, test_rows;
  const PromptColumns columns{data.prompt_key, data.reward_fn_key};
  if (!test_files.empty()) test_rows = read_prompt_rows(test_files, columns);
  if (train_files.empty() || test_files.empty()) {
    auto splits = make_splits(*s.task, data.train_size, data.test_size, seed);
    if (!test_files.empty()) {  // no held-out leak: generated training prompts that the test file holds go
      std::vector<Example> held_out;
      for (const auto& row : test_rows)
        if (!row.is_chat()) held_out.push_back({row.prompt, row.answer});
      drop_prompts_of(held_out, &splits.train);
    }
    train_rows = task_rows(*s.task, splits.train, "training");
    if (test_files.empty()) test_rows = task_rows(*s.task, splits.test, "test");
  }
  if (!train_files.empty()) train_rows = read_prompt_rows(train_files, columns);
  train_rows = at_most_rows(std::move(train_rows), data.train_max_samples, data.shuffle, data.seed.value_or(seed));
  s.train_source = prompts_source(*s.task, train_files);
  s.test_source = prompts_source(*s.task, test_files);
  s.train = encoder.encode(train_rows, s.train_source);
  s.test = encoder.encode(test_rows, s.test_source);
  const int64_t batch_prompts = s.run.data.train_batch_size;
  HF_CHECK(batch_prompts > 0 && static_cast<int64_t>(s.train.size()) >= batch_prompts, "data.train_batch_size: ",
           batch_prompts, " prompts per step need at least that many training examples, have ", s.train.size());
}

// The reward and cost scorers the scoring spec describes (command / HTTP, or a named task's rule), and
// Safe-RLHF's multiplier when a cost is configured.
void RLTrainer::State::make_scorers() {
  State& s = *this;
  const ScoringSpec& scoring = s.run.scoring;
  if (scoring.reward_function) s.reward_fn = make_reward_function(*scoring.reward_function);
  if (scoring.cost_function) s.cost_fn = make_reward_function(*scoring.cost_function);
  if (s.run.algorithm.safe_rlhf) s.lagrange.emplace(*s.run.algorithm.safe_rlhf);
}

// The algorithm and the roles it runs: a critic for GAE (grpo / rloo / reinforce++ / remax need no value
// function), a cost critic beside it for Safe-RLHF, and the reward and cost models when enabled.
void RLTrainer::State::choose_roles() {
  State& s = *this;
  s.kl_ctrl = s.run.algorithm.kl_ctrl.controller();
  s.use_critic = s.run.algorithm.adv_estimator == "gae";
  HF_CHECK(s.run.trainer.critic_warmup == 0 || s.use_critic, "trainer.critic_warmup is ", s.run.trainer.critic_warmup,
           " but the run has no critic to warm up (algorithm.adv_estimator is '", s.run.algorithm.adv_estimator,
           "'; a critic trains with gae): set it to 0");
  s.use_reward_model = s.run.scoring.reward_model;
}

// Which pool each role runs in (placement/placement_spec.h), and the device its processes take.
void RLTrainer::State::place_roles() {
  State& s = *this;
  const Config& config = s.cfg;
  std::vector<std::string> run_roles = {"actor"};
  if (s.use_critic) run_roles.push_back("critic");
  if (s.use_critic && s.lagrange) run_roles.push_back("cost_critic");
  if (s.use_reward_model) run_roles.push_back("reward_model");
  if (s.run.scoring.cost_model) run_roles.push_back("cost_model");
  s.placement = resolve_placement(config, run_roles);
  check_staleness_fits_program(s.placement, s.run.algorithm.program, s.run.algorithm.adv_estimator);
  check_rollout_restarts_fit_placement(s.placement, s.run.trainer.max_rollout_restarts);
  const std::string& device_key = s.run.trainer.device;
  std::string device = resolve_device_name(device_key, "trainer.device");
  const int64_t nnodes = s.run.trainer.nnodes;
  const int per_host = workers_per_host(s.placement, nnodes, launch_env_from_environment());
  if (per_host > 0)
    device = device_for_processes(device, device_key, per_host, static_cast<int64_t>(torch::cuda::device_count()),
                                  "trainer.device", describe_placement(s.placement));
  s.model.device = device;
}

// Each role's spec and layout (trainer/role_spec_builders.h), and the checks that relate them to the
// data and the algorithm.
void RLTrainer::State::specify_roles() {
  State& s = *this;
  const Config& config = s.cfg;
  RoleFacts f;
  f.seed = s.run.trainer.seed;
  f.total_steps = s.run.trainer.total_steps;
  f.batch_prompts = s.run.data.train_batch_size;
  f.adv_estimator = s.run.algorithm.adv_estimator;
  f.kl_in_reward = s.run.algorithm.use_kl_in_reward;
  f.prompts = s.prompt_options;
  f.need_critic = s.use_critic;
  f.need_cost_critic = s.use_critic && s.lagrange.has_value();
  f.need_reward_model = s.use_reward_model;
  f.need_cost_model = s.run.scoring.cost_model;
  f.standalone_rollout = s.placement.standalone_rollout();
  auto pool = [&](const std::string& role, bool runs) {
    RoleFacts::Pool p;
    if (!runs) return p;
    const PoolSpec& spec = s.placement.pool_of(role);
    p.processes = spec.processes;
    p.key = spec.processes_key;
    return p;
  };
  f.actor = pool("actor", true);
  f.rollout = pool("rollout", f.standalone_rollout);
  f.critic = pool("critic", f.need_critic);
  f.cost_critic = pool("cost_critic", f.need_cost_critic);
  f.reward_model = pool("reward_model", f.need_reward_model);
  f.cost_model = pool("cost_model", f.need_cost_model);
  s.specs = build_role_specs(config, f, s.model);
  const RolloutSpec& rollout = s.specs.rollout;
  s.need_ref = s.specs.ref.has_value();
  s.model_config = model_config_of(s.model);
  // Adapters go on dense projections only (model/lora.h): all-linear, the default, would reach the experts. Said
  // here rather than when the workers start; names are checked against the model's modules there.
  auto check_lora_reaches_no_expert = [](const ModelSpec& model, const ModelConfig& config, const std::string& key) {
    const LoraConfig& lora = model.lora;
    HF_CHECK(!lora.enabled() || !model.lora_adapter_path.empty() || config.num_moe_layers() == 0 ||
                 lora.target_modules != std::vector<std::string>{"all-linear"},
             key, ": all-linear on a mixture-of-experts model (", config.model_type, ", ", config.moe.num_experts,
             " experts) would adapt its experts and routers too, as PEFT's does, which hybridflow does not yet; ",
             "name the projections to adapt, e.g. [q_proj, k_proj, v_proj, o_proj]");
  };
  check_lora_reaches_no_expert(s.specs.actor.model, s.model_config, "actor_rollout_ref.model.target_modules");
  if (s.specs.critic && s.specs.critic->model.lora.enabled())
    check_lora_reaches_no_expert(s.specs.critic->model, model_config_of(s.specs.critic->model),
                                 "critic.model.target_modules");
  check_context_fits(s.model, s.model_config, rollout.response_length, s.specs.response_length_key,
                     {{s.train_source, &s.train}, {s.test_source, &s.test}});
  const ScoringSpec::OverlongBuffer& overlong = s.run.scoring.overlong_buffer;
  if (overlong.enable) {
    const int64_t len = overlong.len;
    const int64_t max_length = overlong.max_resp_len > 0 ? overlong.max_resp_len : rollout.response_length;
    HF_CHECK(len > 0 && len <= max_length, "reward_model.overlong_buffer.len must be in (0, ", max_length, "] (",
             overlong.max_resp_len > 0 ? "reward_model.overlong_buffer.max_resp_len" : "the response budget",
             ") when the overlong buffer is enabled, got ", len);
  }
  // verl's bypass mode replaces the policy loss with its PPO clip (rollout_correction.loss_type ppo_clip),
  // which is hybridflow's vanilla loss with the rollout as the old policy.
  const algo::PolicyLossMode loss_mode = s.specs.actor.spec.policy_loss.loss_mode;
  HF_CHECK(!s.run.algorithm.bypass_mode || loss_mode == algo::PolicyLossMode::kVanilla,
           "algorithm.rollout_correction.bypass_mode: true trains with PPO's clipped loss (verl's ppo_clip); ",
           "actor_rollout_ref.actor.policy_loss.loss_mode must be vanilla, got ", algo::to_string(loss_mode));
  HF_CHECK(s.run.algorithm.bypass_mode ||
               s.run.algorithm.rollout_correction.loss_type == algo::RolloutLossType::kPpoClip,
           "algorithm.rollout_correction.loss_type: reinforce is bypass mode's loss; set bypass_mode: true");
}

// The resource pools and a worker group per role, each created with its spec.
void RLTrainer::State::create_groups() {
  State& s = *this;
  const RoleSpecs& specs = s.specs;
  const int threads = s.run.trainer.threads_per_worker;
  log_info("placement ", s.placement.kind,
           (specs.standalone_rollout ? ", staleness " + std::to_string(s.placement.staleness) : ""), ":\n",
           describe_placement(s.placement));
  int local_ranks_taken = 0;  // pools on this node take disjoint LOCAL_RANKs, so disjoint GPUs
  std::vector<ResourcePool> pools;
  for (const PoolSpec& pool : s.placement.pools) {
    ResourcePool spec;
    spec.name = pool.name;
    spec.num_processes = pool.processes;
    spec.local_rank_offset = local_ranks_taken;
    local_ranks_taken += pool.processes;
    spec.env["OMP_NUM_THREADS"] = std::to_string(threads);
    spec.env["OMP_WAIT_POLICY"] = "passive";
    // A rollout pool that may be restarted hands its rollouts to the controller instead of keeping them for
    // the consumers to fetch: what trains must not depend on a rollout process staying alive.
    if (s.run.trainer.max_rollout_restarts > 0 && pool.roles == std::vector<std::string>{"rollout"})
      spec.data_plane = false;
    pools.push_back(spec);
  }
  s.controller.add_pools(pools);
  auto group = [&](const std::string& role, const std::string& type, const ParallelLayout& layout,
                   const ModelSpec& model, nlohmann::json config) {
    return s.make_group(role, type, layout, model, std::move(config));
  };
  nlohmann::json actor_config = {{"actor", specs.actor.spec}, {"rollout", specs.rollout}};
  if (specs.ref) actor_config["ref"] = *specs.ref;
  s.actor = group("actor", kActorRolloutRefWorkerType, specs.actor.layout, specs.actor.model, actor_config);
  if (specs.critic)
    s.critic = group("critic", kCriticWorkerType, specs.critic->layout, specs.critic->model, {{"critic", specs.critic->spec}});
  if (specs.cost_critic)  // Safe-RLHF's cost critic: the critic's settings, its own weights and data order
    s.cost_critic = group("cost_critic", kCriticWorkerType, specs.cost_critic->layout, specs.cost_critic->model,
                          {{"critic", specs.cost_critic->spec}});
  if (specs.reward_model)
    s.reward_model = group("reward_model", kRewardModelWorkerType, specs.reward_model->layout, specs.reward_model->model,
                           {{"scoring", specs.reward_model->spec}});
  if (specs.cost_model)  // a value-head model like the reward model, under its own role
    s.cost_model = group("cost_model", kRewardModelWorkerType, specs.cost_model->layout, specs.cost_model->model,
                         {{"scoring", specs.cost_model->spec}});
  if (specs.standalone_rollout)  // generation on its own pool, from a shadow copy of the actor's weights
    s.rollout = group("rollout", kRolloutWorkerType, specs.standalone_rollout->layout, specs.standalone_rollout->model,
                      {{"rollout", specs.standalone_rollout->spec}});
}

std::unique_ptr<WorkerGroup> RLTrainer::State::make_group(const std::string& role, const std::string& type,
                                                          const ParallelLayout& layout, const ModelSpec& model_spec,
                                                          nlohmann::json config) {
  config["model"] = model_spec;
  config["threads"] = run.trainer.threads_per_worker;
  auto g = std::make_unique<WorkerGroup>(controller.create_group(placement.pool_of(role).name, role, type, layout, config));
  g->record_calls(timeline);
  return g;
}

// The metrics log, the weight link to a standalone rollout pool, and the checkpoint to resume from.
void RLTrainer::State::start(const std::string& resume_dir) {
  State& s = *this;
  s.metrics = std::make_unique<MetricsLog>(s.run.trainer.run_dir, s.sinks);
  const RoleSpecs& specs = s.specs;
  if (specs.standalone_rollout) s.connect_rollout_weight_sync();
  if (!resume_dir.empty()) {
    s.resume(resume_dir);
  } else if (s.run.trainer.resume_mode == "auto" && s.run.trainer.saves()) {
    // A run that saves checkpoints found none, so it starts at step 1: lines that an attempt killed before
    // its first checkpoint wrote are of steps this run takes again. (A run that saves none keeps appending.)
    const int64_t dropped = s.metrics->drop_steps_after(0);
    if (dropped > 0) log_info("dropped ", dropped, " metrics lines of an earlier attempt that saved no checkpoint");
  }
  s.actor_version = s.step;
  // The rollout pool starts from the actor's weights (fresh or resumed), whatever it built itself.
  if (specs.standalone_rollout) {
    s.sync_rollout_weights();
    s.continue_saved_partial_rollouts();
  }
}

std::string RLTrainer::State::prepare() {
  const std::string resume_dir = open_run();
  load_data();
  make_scorers();
  choose_roles();
  place_roles();
  specify_roles();
  return resume_dir;
}

nlohmann::json RLTrainer::check(const Config& config) {
  State s;
  s.cfg = config;
  s.dry_run = true;
  const std::string resume_dir = s.prepare();
  nlohmann::json pools = nlohmann::json::array();
  for (const PoolSpec& pool : s.placement.pools)
    pools.push_back({{"name", pool.name}, {"processes", pool.processes}, {"roles", pool.roles}});
  return {{"program", s.run.algorithm.program},
          {"adv_estimator", s.run.algorithm.adv_estimator},
          {"device", s.model.device},
          {"model", s.model.path.empty() ? "preset " + s.model.preset : s.model.path},
          {"parameters", model_size(s.model_config).parameters()},
          {"reference", s.need_ref},
          {"train_prompts", static_cast<int64_t>(s.train.size())},
          {"test_prompts", static_cast<int64_t>(s.test.size())},
          {"train_batch_size", s.run.data.train_batch_size},
          {"n", s.specs.rollout.n},
          {"response_length", s.specs.rollout.response_length},
          {"total_steps", s.run.trainer.total_steps},
          {"placement", s.placement.kind},
          {"pools", pools},
          {"run_dir", s.run.trainer.run_dir},
          {"resume_from", resume_dir}};
}

RLTrainer::RLTrainer(const Config& config) : s_(std::make_unique<State>()) {
  State& s = *s_;
  s.cfg = config;
  const std::string resume_dir = s.prepare();
  s.create_groups();
  if (s.run.profiler.on) s.profile_targets();  // its rank checks, before any step
  s.start(resume_dir);
}

}  // namespace hybridflow
