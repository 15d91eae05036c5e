#include "hybridflow/trainer/rl_trainer.h"

#include "rl_trainer_state.h"

namespace hybridflow {

namespace {

// The 3D-HybridEngine's two switches of this step as rank 0 measured them (every rank moves the same
// volume in hybridflow mode), taken out of the rollout's meta so that it does not travel on with the batch.
void log_reshard(DataProto& rollout, MetricsLog& m) {
  if (!rollout.meta().contains("reshard")) return;
  const nlohmann::json reshard = rollout.meta().at("reshard");
  rollout.meta().erase("reshard");
  for (const char* direction : {"to_generation", "to_training"}) {
    const auto& s = reshard.at(direction);
    const std::string p = std::string("reshard/") + direction + "_";
    m.set(p + "bytes_sent", s.at("bytes_sent").get<double>());
    m.set(p + "bytes_received", s.at("bytes_received").get<double>());
    m.set(p + "s", s.at("seconds").get<double>());
  }
  const auto& gen = reshard.at("to_generation");
  m.set("reshard/model_bytes", gen.at("model_bytes").get<double>());
  m.set("reshard/peak_extra_weight_bytes", gen.at("peak_extra_weight_bytes").get<double>());
  m.set("reshard/redundant_bytes", gen.at("redundant_bytes").get<double>());
}

}  // namespace

RLTrainer::~RLTrainer() = default;

nlohmann::json RLTrainer::step() {
  State& s = *s_;
  StageTimer timer;
  MetricsLog& m = *s.metrics;
  const int64_t n = s.cfg.get<int64_t>("actor_rollout_ref.rollout.n");
  const uint64_t seed = static_cast<uint64_t>(s.cfg.get<int64_t>("trainer.seed"));

  // 1. Prompts and rollout.
  DataProto prompts = s.next_prompts(s.cfg.get<int64_t>("data.train_batch_size"), s.train, &s.data_pos,
                                     s.cfg.get<bool>("data.shuffle"));
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
  log_reshard(batch, m);
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
    if (s.console_log && (s.step % every == 0 || s.step == total))
      std::cerr << MetricsLog::format_progress(last, total,
                                               {"score/mean", "val/score", "cost/mean", "lagrangian/lambda", "actor/pg_loss", "actor/entropy", "critic/vf_loss",
                                                "response_length/mean", "timing/step_s", "perf/throughput_tokens_per_s"})
                << "\n";
  }
  const bool save_at_end = s.cfg.get<bool>("trainer.save_checkpoint") || s.cfg.get<int64_t>("trainer.save_freq") > 0;
  if (save_at_end && s.last_saved_step != s.step) s.save_checkpoint();
  return last;
}

double RLTrainer::evaluate(int64_t count) {
  State& s = *s_;
  count = std::min<int64_t>(count, static_cast<int64_t>(s.test.size()));
  HF_CHECK(count > 0, "evaluate: no held-out examples (data.test_size or data.test_file)");
  int64_t pos = 0;
  DataProto prompts = s.next_prompts(count, s.test, &pos, /*shuffle=*/false);
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
