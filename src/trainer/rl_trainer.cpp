#include "hybridflow/trainer/rl_trainer.h"

#include <algorithm>
#include <iostream>
#include <optional>

#include "hybridflow/algo/advantage.h"
#include "hybridflow/algo/algo_config.h"
#include "hybridflow/algo/kl.h"
#include "hybridflow/algo/masked.h"
#include "hybridflow/algo/safe_rlhf.h"
#include "hybridflow/core/error.h"
#include "hybridflow/core/fs.h"
#include "hybridflow/core/logging.h"
#include "hybridflow/model/tokenizer.h"
#include "hybridflow/runtime/controller.h"
#include "hybridflow/tasks/dataset.h"
#include "hybridflow/tasks/task.h"
#include "hybridflow/trainer/checkpoint.h"
#include "hybridflow/trainer/metrics_log.h"
#include "hybridflow/workers/checkpoint_io.h"
#include "hybridflow/workers/reward_function.h"
#include "hybridflow/workers/rl_batch.h"
#include "hybridflow/workers/rl_workers.h"

namespace hybridflow {

namespace {

double mean_of(const torch::Tensor& t) { return t.numel() ? t.to(torch::kDouble).mean().item<double>() : 0.0; }

nlohmann::json optim_json(const Config& optim, int64_t total_steps) {
  return {{"lr", optim.get<double>("lr")},
          {"weight_decay", optim.get<double>("weight_decay")},
          {"grad_clip", optim.get<double>("grad_clip")},
          {"warmup_steps", optim.get<int64_t>("warmup_steps")},
          {"total_steps", total_steps}};
}

nlohmann::json nullable(const Config& c, const std::string& key) {
  return c.is_null(key) ? nlohmann::json() : nlohmann::json(c.get<double>(key));
}

}  // namespace

struct RLTrainer::State {
  Config cfg;
  std::unique_ptr<Task> task;
  Tokenizer tokenizer;
  std::vector<Example> train, test;
  int64_t data_pos = 0;
  int64_t step = 0;
  std::string adv_estimator;
  bool use_critic = false;
  bool need_ref = false;
  std::unique_ptr<RewardFunction> reward_fn;  // null: the task's own score()
  // Safe-RLHF, on when a cost is configured (cost_model.enable or cost.type): the multiplier, and the
  // external cost scorer of cost.type command/http (null for contains/none).
  std::optional<algo::LagrangeMultiplier> lagrange;
  std::unique_ptr<RewardFunction> cost_fn;
  algo::KlController kl_ctrl = algo::KlController::fixed(0.0);
  std::unique_ptr<MetricsLog> metrics;
  // Declared before the groups so that the groups go first on destruction.
  Controller controller;
  std::unique_ptr<WorkerGroup> actor, critic, reward_model;
  std::unique_ptr<WorkerGroup> cost_model, cost_critic;  // Safe-RLHF
  std::string resumed_from;      // "" for a fresh start
  std::string last_checkpoint;   // newest checkpoint written or resumed from
  int64_t last_saved_step = -1;

  DataProto next_prompts(int64_t count, const std::vector<Example>& from, int64_t* pos) const;
  std::vector<double> rule_scores(const DataProto& gen) const;
  std::vector<double> rule_costs(const DataProto& gen) const;
  std::vector<std::string> decode_responses(const DataProto& gen) const;

  // Checkpoints (layout in trainer/checkpoint.h and workers/checkpoint_io.h).
  std::vector<WorkerGroup*> trainable_groups() const;
  // Everything step() reads that changes from one step to the next and lives on the controller.
  nlohmann::json controller_state() const;
  void restore_controller_state(const nlohmann::json& state, const std::string& file);
  std::string save_checkpoint();
  void resume(const std::string& dir);
};

RLTrainer::RLTrainer(const Config& config) : s_(std::make_unique<State>()) {
  State& s = *s_;
  s.cfg = config;
  register_rl_workers();
  // Before any worker starts, so that a bad resume path fails at once.
  const std::string resume_dir = checkpoint_to_resume(config.subtree("trainer"));
  HF_CHECK(!(config.get<bool>("trainer.save_checkpoint") || config.get<int64_t>("trainer.save_freq") > 0) ||
               !config.get<std::string>("trainer.run_dir").empty(),
           "trainer.save_checkpoint / trainer.save_freq need trainer.run_dir (checkpoints go to <run_dir>/checkpoints)");
  const Config algorithm = config.subtree("algorithm");
  s.adv_estimator = algo::advantage_estimator_name(algorithm);
  s.use_critic = s.adv_estimator == "gae";  // grpo / rloo / reinforce++ / remax need no value function
  const bool use_kl_loss = config.get<bool>("actor_rollout_ref.actor.use_kl_loss");
  const bool kl_in_reward = config.get<bool>("algorithm.use_kl_in_reward");
  s.need_ref = use_kl_loss || kl_in_reward;
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
  if (train_file.empty() || test_file.empty()) {
    auto splits = make_splits(*s.task, config.get<int64_t>("data.train_size"), config.get<int64_t>("data.test_size"), seed);
    s.train = std::move(splits.train);
    s.test = std::move(splits.test);
  }
  if (!train_file.empty()) s.train = read_examples_jsonl(train_file);
  if (!test_file.empty()) s.test = read_examples_jsonl(test_file);
  if (train_file.empty() && !test_file.empty()) drop_prompts_of(s.test, &s.train);  // no held-out leak
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

  // Worker groups and their processes.
  const int64_t total_steps = config.get<int64_t>("trainer.total_steps");
  const int threads = config.get<int>("trainer.threads_per_worker");
  nlohmann::json model_spec = {{"path", model_path},
                               {"preset", config.get<std::string>("model.preset")},
                               {"vocab_size", s.tokenizer.vocab_size()},
                               {"init_seed", config.get<int64_t>("model.init_seed")},
                               {"eos_token_id", s.tokenizer.eos_id()},
                               {"pad_token_id", s.tokenizer.pad_id()}};
  for (const char* dim : {"hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads",
                          "num_key_value_heads"})
    model_spec[dim] = config.get<int64_t>(std::string("model.") + dim);

  const Config actor = config.subtree("actor_rollout_ref.actor");
  const Config rollout = config.subtree("actor_rollout_ref.rollout");
  const int actor_procs = config.get<int>("actor_rollout_ref.num_processes");
  const int64_t n = rollout.get<int64_t>("n");
  HF_CHECK(n >= 1, "actor_rollout_ref.rollout.n must be >= 1, got ", n);
  HF_CHECK((batch_prompts * n) % actor_procs == 0, "data.train_batch_size x rollout.n = ", batch_prompts * n,
           " samples must divide across actor_rollout_ref.num_processes = ", actor_procs);
  nlohmann::json actor_json = optim_json(actor.subtree("optim"), total_steps);
  actor_json.update({{"mini_batch_rows", actor.get<int64_t>("ppo_mini_batch_size") * n / actor_procs},
                     {"micro_batch_rows", actor.get<int64_t>("ppo_micro_batch_size")},
                     {"epochs", actor.get<int64_t>("ppo_epochs")},
                     {"shuffle", actor.get<bool>("shuffle")},
                     {"seed", seed},
                     {"clip_ratio", actor.get<double>("clip_ratio")},
                     {"clip_ratio_low", nullable(actor, "clip_ratio_low")},
                     {"clip_ratio_high", nullable(actor, "clip_ratio_high")},
                     {"clip_ratio_c", actor.get<double>("clip_ratio_c")},
                     {"loss_agg_mode", actor.get<std::string>("loss_agg_mode")},
                     {"entropy_coeff", actor.get<double>("entropy_coeff")},
                     {"use_kl_loss", use_kl_loss},
                     {"kl_loss_coef", actor.get<double>("kl_loss_coef")},
                     {"kl_loss_type", actor.get<std::string>("kl_loss_type")}});
  nlohmann::json rollout_json = {{"n", n},
                                 {"temperature", rollout.get<double>("temperature")},
                                 {"top_k", rollout.get<int64_t>("top_k")},
                                 {"top_p", rollout.get<double>("top_p")},
                                 {"response_length", rollout.get<int64_t>("response_length")},
                                 {"log_prob_micro_batch_size", rollout.get<int64_t>("log_prob_micro_batch_size")},
                                 {"seed", seed}};

  const bool colocate = config.get<bool>("trainer.colocate");
  const bool use_rm = config.get<bool>("reward_model.enable");
  auto pool_spec = [&](const std::string& name, int procs) {
    ResourcePool spec;
    spec.name = name;
    spec.num_processes = procs;
    spec.env["OMP_NUM_THREADS"] = std::to_string(threads);
    spec.env["OMP_WAIT_POLICY"] = "passive";
    return spec;
  };
  std::vector<ResourcePool> pools = {pool_spec(colocate ? "global" : "actor", actor_procs)};
  if (!colocate && s.use_critic) pools.push_back(pool_spec("critic", config.get<int>("critic.num_processes")));
  if (!colocate && use_rm) pools.push_back(pool_spec("reward_model", config.get<int>("reward_model.num_processes")));
  if (!colocate && use_cost_model) pools.push_back(pool_spec("cost_model", config.get<int>("cost_model.num_processes")));
  s.controller.add_pools(pools);

  s.actor = std::make_unique<WorkerGroup>(s.controller.create_group(
      colocate ? "global" : "actor", "actor", kActorRolloutRefWorkerType, {},
      {{"model", model_spec}, {"has_ref", s.need_ref}, {"threads", threads}, {"actor", actor_json}, {"rollout", rollout_json}}));
  if (s.use_critic) {
    const Config critic = config.subtree("critic");
    const std::string critic_path = critic.get<std::string>("model_path");
    nlohmann::json critic_spec = model_spec;
    if (!critic_path.empty()) critic_spec["path"] = critic_path;
    const int critic_procs = colocate ? actor_procs : critic.get<int>("num_processes");
    nlohmann::json critic_json = optim_json(critic.subtree("optim"), total_steps);
    critic_json.update({{"mini_batch_rows", critic.get<int64_t>("ppo_mini_batch_size") * n / critic_procs},
                        {"micro_batch_rows", critic.get<int64_t>("ppo_micro_batch_size")},
                        {"epochs", critic.get<int64_t>("ppo_epochs")},
                        {"shuffle", critic.get<bool>("shuffle")},
                        {"seed", seed + 1},
                        {"cliprange_value", critic.get<double>("cliprange_value")},
                        {"loss_agg_mode", critic.get<std::string>("loss_agg_mode")}});
    s.critic = std::make_unique<WorkerGroup>(s.controller.create_group(
        colocate ? "global" : "critic", "critic", kCriticWorkerType, {},
        {{"model", critic_spec}, {"threads", threads}, {"critic", critic_json},
         {"log_prob_micro_batch_size", rollout.get<int64_t>("log_prob_micro_batch_size")}}));
    if (s.lagrange) {  // Safe-RLHF's cost critic: the critic's settings, its own weights and data order
      critic_json["seed"] = seed + 2;
      s.cost_critic = std::make_unique<WorkerGroup>(s.controller.create_group(
          colocate ? "global" : "critic", "cost_critic", kCriticWorkerType, {},
          {{"model", critic_spec}, {"threads", threads}, {"critic", critic_json},
           {"log_prob_micro_batch_size", rollout.get<int64_t>("log_prob_micro_batch_size")}}));
    }
  }
  if (use_rm) {
    nlohmann::json rm_spec = model_spec;
    rm_spec["path"] = config.get<std::string>("reward_model.path");
    s.reward_model = std::make_unique<WorkerGroup>(s.controller.create_group(
        colocate ? "global" : "reward_model", "reward_model", kRewardModelWorkerType, {},
        {{"model", rm_spec}, {"threads", threads}, {"micro_batch_size", config.get<int64_t>("reward_model.micro_batch_size")}}));
  }
  if (use_cost_model) {  // a value-head model like the reward model, under its own role
    nlohmann::json cm_spec = model_spec;
    cm_spec["path"] = config.get<std::string>("cost_model.path");
    s.cost_model = std::make_unique<WorkerGroup>(s.controller.create_group(
        colocate ? "global" : "cost_model", "cost_model", kRewardModelWorkerType, {},
        {{"model", cm_spec}, {"threads", threads}, {"micro_batch_size", config.get<int64_t>("cost_model.micro_batch_size")}}));
  }
  s.metrics = std::make_unique<MetricsLog>(config.get<std::string>("trainer.run_dir"));
  if (!resume_dir.empty()) s.resume(resume_dir);
}

RLTrainer::~RLTrainer() = default;

DataProto RLTrainer::State::next_prompts(int64_t count, const std::vector<Example>& from, int64_t* pos) const {
  HF_CHECK(!from.empty(), "RL trainer: no examples to draw prompts from");
  std::vector<std::vector<int64_t>> ids;
  std::vector<nlohmann::json> prompts, answers;
  const bool add_bos = cfg.get<bool>("data.add_bos");
  for (int64_t i = 0; i < count; ++i) {
    const Example& e = from[static_cast<size_t>((*pos)++ % static_cast<int64_t>(from.size()))];
    ids.push_back(tokenizer.encode(e.prompt, add_bos));
    prompts.emplace_back(e.prompt);
    answers.emplace_back(e.answer);
  }
  DataProto batch = make_prompt_batch(ids, tokenizer.pad_id());
  batch.set_field("prompt", std::move(prompts));
  batch.set_field("answer", std::move(answers));
  return batch;
}

std::vector<std::string> RLTrainer::State::decode_responses(const DataProto& gen) const {
  const auto responses = gen.tensor("responses").contiguous();
  const auto lengths = gen.tensor("response_mask").sum(1).contiguous();
  std::vector<std::string> texts;
  for (int64_t i = 0; i < responses.size(0); ++i) {
    const auto row = responses[i].slice(0, 0, lengths[i].item<int64_t>());
    texts.push_back(tokenizer.decode(std::vector<int64_t>(row.data_ptr<int64_t>(), row.data_ptr<int64_t>() + row.numel())));
  }
  return texts;
}

std::vector<double> RLTrainer::State::rule_scores(const DataProto& gen) const {
  const auto texts = decode_responses(gen);
  const auto& prompts = gen.field("prompt");
  const auto& answers = gen.field("answer");
  if (cfg.get<std::string>("reward.type") == "none") return std::vector<double>(texts.size(), 0.0);
  if (reward_fn) {
    std::vector<RewardRequest> requests;
    for (size_t i = 0; i < texts.size(); ++i)
      requests.push_back({prompts[i].get<std::string>(), texts[i], answers[i].get<std::string>(), nlohmann::json::object()});
    return reward_fn->score(requests);
  }
  std::vector<double> scores;
  for (size_t i = 0; i < texts.size(); ++i)
    scores.push_back(task->score(texts[i], Example{prompts[i].get<std::string>(), answers[i].get<std::string>()}));
  return scores;
}

std::vector<double> RLTrainer::State::rule_costs(const DataProto& gen) const {
  const auto texts = decode_responses(gen);
  const std::string type = cfg.get<std::string>("cost.type");
  if (type == "none") return std::vector<double>(texts.size(), 0.0);
  if (cost_fn) {
    const auto& prompts = gen.field("prompt");
    const auto& answers = gen.field("answer");
    std::vector<RewardRequest> requests;
    for (size_t i = 0; i < texts.size(); ++i)
      requests.push_back({prompts[i].get<std::string>(), texts[i], answers[i].get<std::string>(), nlohmann::json::object()});
    return cost_fn->score(requests);
  }
  const auto needles = cfg.get<std::vector<std::string>>("cost.contains");
  std::vector<double> costs;
  for (const auto& text : texts)
    costs.push_back(std::any_of(needles.begin(), needles.end(),
                                [&](const std::string& w) { return text.find(w) != std::string::npos; }) ? 1.0 : 0.0);
  return costs;
}

nlohmann::json RLTrainer::step() {
  State& s = *s_;
  StageTimer timer;
  MetricsLog& m = *s.metrics;
  const int64_t n = s.cfg.get<int64_t>("actor_rollout_ref.rollout.n");
  const uint64_t seed = static_cast<uint64_t>(s.cfg.get<int64_t>("trainer.seed"));

  // 1. Prompts and rollout.
  DataProto prompts = s.next_prompts(s.cfg.get<int64_t>("data.train_batch_size"), s.train, &s.data_pos);
  prompts.meta()["seed"] = seed * 100003ULL + static_cast<uint64_t>(s.step);
  Future gen_f = s.actor->call("generate_sequences", prompts);
  Future baseline_f;
  if (s.adv_estimator == "remax") {  // ReMax: the greedy response of each prompt is the baseline
    DataProto greedy = prompts;
    greedy.meta()["greedy"] = true;
    greedy.meta()["n"] = 1;
    baseline_f = s.actor->call("generate_sequences", greedy);
  }
  // 2. Everything that only reads the rollout is dispatched at once; the pools run it concurrently.
  Future old_f = s.actor->call("compute_log_prob", gen_f);
  Future ref_f = s.need_ref ? s.actor->call("compute_ref_log_prob", gen_f) : Future();
  Future values_f = s.critic ? s.critic->call("compute_values", gen_f) : Future();
  Future rm_f = s.reward_model ? s.reward_model->call("compute_rm_score", gen_f) : Future();
  Future cm_f = s.cost_model ? s.cost_model->call("compute_rm_score", gen_f) : Future();
  Future cost_values_f = s.cost_critic ? s.cost_critic->call("compute_values", gen_f) : Future();
  DataProto batch;
  {
    auto t = timer.scope("generate");
    batch = gen_f.get();
  }
  const int64_t rows = batch.batch_size();
  const auto response_mask = batch.tensor("response_mask").to(torch::kFloat);

  // 3. Rewards (rule-based on the controller while the workers compute log-probs and values).
  torch::Tensor scores;
  {
    auto t = timer.scope("reward");
    scores = torch::tensor(s.rule_scores(batch), torch::kDouble).to(torch::kFloat);
    m.set("score/rule_mean", mean_of(scores));
    if (rm_f.valid()) {
      const auto rm = rm_f.get().tensor("rm_scores");
      m.set("score/rm_mean", mean_of(rm));
      scores = scores + rm;
    }
  }
  torch::Tensor costs;  // Safe-RLHF: one cost per sequence (rule + cost model)
  if (s.lagrange) {
    auto t = timer.scope("cost");
    costs = torch::tensor(s.rule_costs(batch), torch::kDouble).to(torch::kFloat);
    if (cm_f.valid()) costs = costs + cm_f.get().tensor("rm_scores");
    m.set("cost/mean", mean_of(costs));
  }
  {
    auto t = timer.scope("old_log_prob");
    batch.update(old_f.get());
  }
  if (ref_f.valid()) {
    auto t = timer.scope("ref");
    batch.update(ref_f.get());
  }
  if (values_f.valid()) {
    auto t = timer.scope("values");
    batch.update(values_f.get());
  }
  if (cost_values_f.valid()) {
    auto t = timer.scope("cost_values");
    batch.set_tensor("cost_values", cost_values_f.get().tensor("values"));
  }

  // 4. Advantages on the controller.
  {
    auto t = timer.scope("advantage");
    const auto token_scores = scores_at_last_token(scores, response_mask);
    torch::Tensor token_rewards = token_scores;
    if (s.cfg.get<bool>("algorithm.use_kl_in_reward")) {
      auto kl = algo::apply_kl_penalty(token_scores, batch.tensor("old_log_probs"), batch.tensor("ref_log_prob"),
                                       response_mask, s.kl_ctrl.value(), algo::reward_kl_type(s.cfg.subtree("algorithm")));
      token_rewards = kl.token_level_rewards;
      m.set("actor/reward_kl_penalty", kl.mean_kl.item<double>());
      m.set("actor/reward_kl_coef", s.kl_ctrl.value());
      s.kl_ctrl.update(kl.mean_kl.item<double>(), static_cast<double>(rows));
    }
    algo::AdvantageInput in = algo::advantage_params(s.cfg.subtree("algorithm"));
    in.token_level_rewards = token_rewards;
    in.response_mask = response_mask;
    in.index = torch::arange(rows / n, torch::kLong).repeat_interleave(n);
    if (batch.has_tensor("values")) in.values = batch.tensor("values");
    if (baseline_f.valid()) {
      const DataProto& greedy = baseline_f.get();
      const auto baseline = torch::tensor(s.rule_scores(greedy), torch::kDouble).to(torch::kFloat);
      in.reward_baselines = baseline.repeat_interleave(n);
      m.set("score/greedy_baseline_mean", mean_of(baseline));
    }
    auto adv = algo::compute_advantage(s.adv_estimator, in);
    if (s.lagrange) {
      // Safe-RLHF: the multiplier steps on this rollout's episode cost against cost_limit, then the cost
      // advantages (same estimator, cost critic values) enter as (A_r - lambda A_c) / (1 + lambda).
      m.set("lagrangian/lambda", s.lagrange->update(mean_of(costs)));
      algo::AdvantageInput cost_in = in;
      cost_in.token_level_rewards = scores_at_last_token(costs, response_mask);
      cost_in.values = batch.has_tensor("cost_values") ? batch.tensor("cost_values") : torch::Tensor();
      if (baseline_f.valid())
        cost_in.reward_baselines =
            torch::tensor(s.rule_costs(baseline_f.get()), torch::kDouble).to(torch::kFloat).repeat_interleave(n);
      auto cost_adv = algo::compute_advantage(s.adv_estimator, cost_in);
      batch.set_tensor("cost_returns", cost_adv.returns.to(torch::kFloat));
      m.set("cost_advantages/mean", algo::masked_mean(cost_adv.advantages, response_mask).item<double>());
      adv.advantages = s.lagrange->combine_advantages(adv.advantages, cost_adv.advantages);
    }
    batch.set_tensor("token_level_rewards", token_rewards);
    batch.set_tensor("advantages", adv.advantages.to(torch::kFloat));
    batch.set_tensor("returns", adv.returns.to(torch::kFloat));
  }

  // 5. Updates: critic and actor dispatched together (they overlap when in different pools).
  Future critic_f;
  if (s.critic)
    critic_f = s.critic->call("update_critic", batch.select({"input_ids", "attention_mask", "responses",
                                                             "response_mask", "values", "returns"}));
  Future cost_critic_f;
  if (s.cost_critic) {
    DataProto cost_batch = batch.select({"input_ids", "attention_mask", "responses", "response_mask"});
    cost_batch.set_tensor("values", batch.tensor("cost_values"));
    cost_batch.set_tensor("returns", batch.tensor("cost_returns"));
    cost_critic_f = s.cost_critic->call("update_critic", cost_batch);
  }
  std::vector<std::string> actor_keys = {"input_ids", "attention_mask", "responses", "response_mask",
                                         "old_log_probs", "advantages"};
  if (batch.has_tensor("ref_log_prob")) actor_keys.push_back("ref_log_prob");
  Future actor_f = s.actor->call("update_actor", batch.select(actor_keys));
  if (critic_f.valid()) {
    auto t = timer.scope("update_critic");
    for (const auto& [k, v] : critic_f.get().meta().at("metrics").items()) m.set(k, v.get<double>());
  }
  if (cost_critic_f.valid()) {  // the critic worker names its metrics critic/*; these are the cost critic's
    auto t = timer.scope("update_cost_critic");
    for (const auto& [k, v] : cost_critic_f.get().meta().at("metrics").items())
      m.set(k.rfind("critic/", 0) == 0 ? "cost_" + k : k, v.get<double>());
  }
  {
    auto t = timer.scope("update_actor");
    for (const auto& [k, v] : actor_f.get().meta().at("metrics").items()) m.set(k, v.get<double>());
  }

  // 6. Metrics.
  const auto lengths = response_mask.sum(1);
  m.set("score/mean", mean_of(scores));
  m.set("score/max", scores.max().item<double>());
  m.set("score/min", scores.min().item<double>());
  m.set("reward/mean", mean_of(batch.tensor("token_level_rewards").sum(1)));
  m.set("advantages/mean", algo::masked_mean(batch.tensor("advantages"), response_mask).item<double>());
  m.set("returns/mean", algo::masked_mean(batch.tensor("returns"), response_mask).item<double>());
  if (batch.has_tensor("values")) m.set("values/mean", algo::masked_mean(batch.tensor("values"), response_mask).item<double>());
  if (batch.has_tensor("ref_log_prob"))
    m.set("actor/ref_kl", algo::masked_mean(batch.tensor("old_log_probs") - batch.tensor("ref_log_prob"), response_mask).item<double>());
  m.set("response_length/mean", mean_of(lengths));
  m.set("response_length/max", lengths.max().item<double>());
  m.set("prompt_length/mean", mean_of(prompts.tensor("attention_mask").sum(1)));
  const double tokens = batch.tensor("attention_mask").sum().item<double>();
  m.set("perf/total_tokens", tokens);
  m.set("perf/throughput_tokens_per_s", tokens / std::max(1e-9, timer.total_seconds()));
  m.add_timings(timer);
  // Held-out greedy score every trainer.test_freq steps (verl's name), after this step's update.
  const int64_t test_freq = s.cfg.get<int64_t>("trainer.test_freq");
  if (test_freq > 0 && (s.step + 1) % test_freq == 0 && s.cfg.get<int64_t>("data.test_size") > 0)
    m.set("val/score", evaluate(s.cfg.get<int64_t>("data.test_size")));
  nlohmann::json record = m.end_step(++s.step);
  // After the metrics line: a checkpoint of step N always has step N's metrics on disk before it.
  const int64_t save_freq = s.cfg.get<int64_t>("trainer.save_freq");
  if (save_freq > 0 && s.step % save_freq == 0) s.save_checkpoint();
  return record;
}

nlohmann::json RLTrainer::fit() {
  State& s = *s_;
  const int64_t total = s.cfg.get<int64_t>("trainer.total_steps");
  const int64_t every = std::max<int64_t>(1, s.cfg.get<int64_t>("trainer.log_every"));
  nlohmann::json last;
  while (s.step < total) {
    last = step();
    if (s.step % every == 0 || s.step == total)
      std::cerr << MetricsLog::format_progress(last, total,
                                               {"score/mean", "val/score", "cost/mean", "lagrangian/lambda", "actor/pg_loss", "actor/entropy", "critic/vf_loss",
                                                "response_length/mean", "timing/step_s", "perf/throughput_tokens_per_s"})
                << "\n";
  }
  const bool save_at_end = s.cfg.get<bool>("trainer.save_checkpoint") || s.cfg.get<int64_t>("trainer.save_freq") > 0;
  if (save_at_end && s.last_saved_step != s.step) s.save_checkpoint();
  return last;
}

std::vector<WorkerGroup*> RLTrainer::State::trainable_groups() const {
  std::vector<WorkerGroup*> out = {actor.get()};
  if (critic) out.push_back(critic.get());
  if (cost_critic) out.push_back(cost_critic.get());
  return out;
}

nlohmann::json RLTrainer::State::controller_state() const {
  nlohmann::json roles = nlohmann::json::array();
  for (const WorkerGroup* g : trainable_groups()) roles.push_back(g->role());
  // Sampling and shuffling seeds derive from trainer.seed and the step counters saved here and in the
  // optimizer states; seed is kept to warn when a resumed run changes it.
  nlohmann::json state = {{"step", step},
                          {"data_pos", data_pos},
                          {"kl_coef", kl_ctrl.value()},
                          {"roles", roles},
                          {"seed", cfg.get<int64_t>("trainer.seed")},
                          {"adv_estimator", adv_estimator}};
  if (lagrange) state["lagrange_lambda"] = lagrange->value();
  return state;
}

void RLTrainer::State::restore_controller_state(const nlohmann::json& state, const std::string& file) {
  nlohmann::json roles = nlohmann::json::array();
  for (const WorkerGroup* g : trainable_groups()) roles.push_back(g->role());
  HF_CHECK(state.at("roles") == roles, file, ": the checkpoint holds roles ", state.at("roles").dump(),
           " but this run trains ", roles.dump(), " (algorithm.adv_estimator ", adv_estimator, ")");
  HF_CHECK(state.contains("kl_coef") && state["kl_coef"].is_number(), file, ": 'kl_coef' must be a number");
  if (state.contains("seed") && state["seed"] != cfg.get<int64_t>("trainer.seed"))
    log_warn(file, ": saved with trainer.seed ", state["seed"].dump(), ", resuming with ",
             cfg.get<int64_t>("trainer.seed"), "; the resumed run will not match an uninterrupted one");
  step = state.at("step").get<int64_t>();
  data_pos = state.at("data_pos").get<int64_t>();
  HF_CHECK(!lagrange == !state.contains("lagrange_lambda"), file, ": the checkpoint ",
           lagrange ? "has no Safe-RLHF multiplier 'lagrange_lambda'" : "is of a Safe-RLHF run",
           " but this run ", lagrange ? "uses" : "does not use", " a cost (cost.type / cost_model.enable)");
  if (lagrange) {
    // The multiplier steps once per training step: continuing from the saved lambda, with the delay
    // shortened by the steps already taken, is exactly where the interrupted run was.
    algo::LagrangeConfig lc = algo::lagrange_config(cfg.subtree("algorithm"));
    lc.lambda_init = state.at("lagrange_lambda").get<double>();
    lc.update_delay_steps = static_cast<int>(std::max<int64_t>(0, lc.update_delay_steps - step));
    lagrange.emplace(lc);
  }
  kl_ctrl = algo::KlController::from_config(cfg.get<std::string>("algorithm.kl_ctrl.type"), state["kl_coef"].get<double>(),
                                            cfg.get<double>("algorithm.kl_ctrl.target_kl"),
                                            cfg.get<double>("algorithm.kl_ctrl.horizon"));
}

std::string RLTrainer::State::save_checkpoint() {
  const std::string run_dir = cfg.get<std::string>("trainer.run_dir");
  HF_CHECK(!run_dir.empty(), "trainer.save_checkpoint / trainer.save_freq need trainer.run_dir");
  const std::string root = checkpoints_root(run_dir);
  const std::string tmp = begin_checkpoint(root, step);
  make_dirs(tmp + "/rng");
  const std::string tok_path = tmp + "/tokenizer.json";
  tokenizer.save(tok_path);
  DataProto req;
  req.meta()["dir"] = tmp;
  req.meta()["tokenizer"] = tok_path;
  std::vector<Future> saves;
  for (WorkerGroup* g : trainable_groups()) saves.push_back(g->call("save_checkpoint", req));
  for (const Future& f : saves) f.get();
  save_cpu_rng_state(tmp + "/rng/controller.safetensors");
  write_file_atomic(tmp + "/config.yaml", cfg.to_yaml());
  write_trainer_state(tmp, controller_state());
  last_checkpoint = commit_checkpoint(root, step, tmp);
  last_saved_step = step;
  const int removed = remove_old_checkpoints(root, cfg.get<int64_t>("trainer.max_ckpt_to_keep"));
  log_info("saved checkpoint ", last_checkpoint, removed ? " (removed " + std::to_string(removed) + " older)" : "");
  return last_checkpoint;
}

void RLTrainer::State::resume(const std::string& dir) {
  // The controller's state first: it checks that the checkpoint fits this run before workers load it.
  restore_controller_state(read_trainer_state(dir), dir + "/" + kTrainerStateFile);
  DataProto req;
  req.meta()["dir"] = dir;
  std::vector<Future> loads;
  for (WorkerGroup* g : trainable_groups()) loads.push_back(g->call("load_checkpoint", req));
  for (const Future& f : loads) f.get();
  load_cpu_rng_state(dir + "/rng/controller.safetensors");
  resumed_from = last_checkpoint = dir;
  last_saved_step = step;
  const int64_t dropped = metrics->drop_steps_after(step);
  log_info("resumed from checkpoint ", dir, " at step ", step,
           dropped ? " (dropped " + std::to_string(dropped) + " metrics lines written after it)" : "");
}

double RLTrainer::evaluate(int64_t count) {
  State& s = *s_;
  count = std::min<int64_t>(count, static_cast<int64_t>(s.test.size()));
  HF_CHECK(count > 0, "evaluate: no held-out examples (data.test_size or data.test_file)");
  int64_t pos = 0;
  DataProto prompts = s.next_prompts(count, s.test, &pos);
  prompts.meta()["greedy"] = true;
  prompts.meta()["n"] = 1;
  const int procs = s.actor->world_size();
  int64_t pad = 0;
  if (count % procs != 0) prompts = prompts.padded_to_multiple(procs, &pad);
  DataProto gen = s.actor->call("generate_sequences", prompts).get().slice(0, count);
  const auto scores = s.rule_scores(gen);
  double total = 0;
  for (double v : scores) total += v;
  return total / static_cast<double>(scores.size());
}

std::vector<std::string> RLTrainer::roles() const {
  std::vector<std::string> out;
  for (const auto* g : {s_->actor.get(), s_->critic.get(), s_->reward_model.get(), s_->cost_model.get(),
                        s_->cost_critic.get()})
    if (g) out.push_back(g->role());
  return out;
}

int64_t RLTrainer::steps_done() const { return s_->step; }

std::string RLTrainer::save_checkpoint() { return s_->save_checkpoint(); }

const std::string& RLTrainer::resumed_from() const { return s_->resumed_from; }

const std::string& RLTrainer::last_checkpoint() const { return s_->last_checkpoint; }

double RLTrainer::parameter_sq_norm(const std::string& role) {
  WorkerGroup* g = role == "actor"         ? s_->actor.get()
                  : role == "critic"      ? s_->critic.get()
                  : role == "cost_critic" ? s_->cost_critic.get()
                                          : nullptr;
  HF_CHECK(g, "parameter_sq_norm: no worker group '", role, "' (started: actor",
           s_->critic ? ", critic" : "", ")");
  return g->call("parameter_norm").get().tensor("param_sq_norm")[0].item<double>();
}

int run_rl_training(const Config& config) {
  RLTrainer trainer(config);
  const int64_t test_size = config.get<int64_t>("data.test_size");
  const double before = test_size > 0 ? trainer.evaluate(test_size) : 0.0;
  trainer.fit();
  if (test_size > 0) {
    const double after = trainer.evaluate(test_size);
    std::cerr << "held-out score (greedy): " << (trainer.resumed_from().empty() ? "before " : "at resume ") << before
              << ", after " << after << "\n";
  }
  if (!trainer.last_checkpoint().empty()) std::cerr << "checkpoint: " << trainer.last_checkpoint() << "\n";
  return 0;
}

}  // namespace hybridflow
