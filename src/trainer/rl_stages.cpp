// The stages RL programs are written in (trainer/rl_program.h), over the trainer's worker groups. Here
// live the futures, the timing of every wait, the step's metrics and the checkpoint cadence, so that a
// program holds only its algorithm.
#include "rl_stages.h"

#include "hybridflow/algo/dapo.h"
#include "hybridflow/algo/rollout_correction.h"
#include "hybridflow/workers/data_parallel.h"
#include "score_guard.h"

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

torch::Tensor to_float_tensor(const std::vector<double>& values) {
  return torch::tensor(values, torch::kDouble).to(torch::kFloat);
}

// Returns whether the update skipped an optimizer step (a non-finite gradient norm: no weight was touched).
bool add_metrics(MetricsLog& m, const Future& f, const std::string& rename_prefix = "") {
  bool skipped = false;
  for (const auto& [k, v] : f.get().meta().at("metrics").items()) {
    // JSON has no NaN or inf: a worker's non-finite loss or gradient norm arrives as null.
    m.set(!rename_prefix.empty() && k.rfind("critic/", 0) == 0 ? rename_prefix + k : k,
          v.is_number() ? v.get<double>() : std::nan(""));
    skipped = skipped || (k.size() >= 13 && k.compare(k.size() - 13, 13, "skipped_steps") == 0);
  }
  return skipped;
}

}  // namespace

TrainerStages::TrainerStages(RLTrainer::State& s)
    : s_(s),
      step_start_(CallSpan::Clock::now()),
      step_start_unix_s_(std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count()) {
  s_.timeline->take();  // calls made between steps (evaluation, checkpoints) are not this step's
  s_.controller.take_traffic();  // nor their bytes
}

const Config& TrainerStages::config() const { return s_.cfg; }

MetricsLog& TrainerStages::metrics() { return *s_.metrics; }

int64_t TrainerStages::step() const { return s_.step; }

algo::LagrangeMultiplier& TrainerStages::lagrange() {
  HF_CHECK(s_.lagrange.has_value(), "algorithm program '", s_.program,
           "' uses the Safe-RLHF multiplier, but no cost is configured (cost_model.enable or cost.type)");
  return *s_.lagrange;
}

DataProto TrainerStages::next_prompts(int64_t count) {
  if (count <= 0) count = s_.cfg.get<int64_t>("data.train_batch_size");
  const bool first = !drew_prompts_;
  drew_prompts_ = true;
  // One-step off-policy: the previous step drew this step's prompts and is generating them already.
  if (first && s_.prefetch && s_.prefetch->for_step == s_.step) {
    HF_CHECK(count == s_.prefetch->prompts.batch_size(), "algorithm program '", s_.program, "': its first ",
             "next_prompts(", count, ") differs from the ", s_.prefetch->prompts.batch_size(),
             " prompts the previous step generated for it (actor_rollout_ref.rollout.staleness 1)");
    return s_.prefetch->prompts;
  }
  return s_.next_prompts(count, s_.train, &s_.data_pos, s_.cfg.get<bool>("data.shuffle"));
}

DataProto TrainerStages::generation_request(const DataProto& prompts, int64_t step, uint64_t round) const {
  DataProto request = prompts;
  // The first sampled generation of a step keeps the seed of the one-generation programs; a program that
  // samples again in the same step (DAPO) draws fresh samples.
  const uint64_t seed = static_cast<uint64_t>(s_.cfg.get<int64_t>("trainer.seed"));
  request.meta()["seed"] = seed * 100003ULL + static_cast<uint64_t>(step) + 7777777ULL * round;
  return request;
}

Future TrainerStages::sampled_generation(const DataProto& prompts, uint64_t round) {
  WorkerGroup& generator = s_.generator();
  if (s_.placement.staleness == 0 || round > 0)
    return generator.call("generate_sequences", generation_request(prompts, s_.step, round));
  Future batch;
  if (s_.prefetch && s_.prefetch->for_step == s_.step) {
    HF_CHECK(prompts.serialize() == s_.prefetch->prompts.serialize(), "algorithm program '", s_.program,
             "': with actor_rollout_ref.rollout.staleness 1 its first sampled generation must be of the prompts its ",
             "first next_prompts() returned (the previous step generated those)");
    batch = s_.prefetch->batch;
  } else {
    batch = generator.call("generate_sequences", generation_request(prompts, s_.step, round));
  }
  s_.prefetch.reset();
  // The next step's rollout, generated on the rollout pool with the weights it holds now (one update
  // behind the ones the next step trains) while this step's log-probs, values and updates run.
  if (s_.step + 1 < s_.cfg.get<int64_t>("trainer.total_steps")) {
    RLTrainer::State::Prefetch next;
    next.for_step = s_.step + 1;
    next.prompts = s_.next_prompts(s_.cfg.get<int64_t>("data.train_batch_size"), s_.train, &s_.data_pos,
                                   s_.cfg.get<bool>("data.shuffle"));
    next.batch = generator.call("generate_sequences", generation_request(next.prompts, next.for_step, 0));
    s_.prefetch = std::move(next);
  }
  return batch;
}

void TrainerStages::stamp_policy_version(DataProto& batch) const {
  if (!batch.has_tensor("policy_version"))
    batch.set_tensor("policy_version", torch::full({batch.batch_size()}, s_.step, torch::kLong));
}

Generation TrainerStages::generate(const DataProto& prompts, bool greedy) {
  Generation g;
  if (greedy) {
    DataProto request = prompts;
    request.meta()["greedy"] = true;
    request.meta()["n"] = 1;
    g.batch = s_.generator().call("generate_sequences", request);
  } else {
    g.batch = sampled_generation(prompts, sampled_generations_++);
  }
  if (s_.reward_model) g.rm_score = s_.reward_model->call("compute_rm_score", g.batch);
  if (s_.cost_model) g.cost_score = s_.cost_model->call("compute_rm_score", g.batch);
  return g;
}

const DataProto& TrainerStages::wait_generation(const Future& batch) {
  auto t = timer_.scope("generate");
  return batch.get();
}

torch::Tensor TrainerStages::sequence_scores(const DataProto& gen, const Future& rm_score, bool log) {
  auto t = timer_.scope("reward");
  const auto clip = reward_clip_from_config(s_.cfg);
  int64_t clipped = 0;
  torch::Tensor scores;
  {
    ControllerSpan span(*s_.timeline, "rule_score");
    scores = guard_scores(to_float_tensor(s_.rule_scores(gen)), "the rule reward (reward.type " +
                          s_.cfg.get<std::string>("reward.type") + ")", s_.step + 1, clip, &clipped);
  }
  if (log) s_.metrics->set("score/rule_mean", mean_of(scores));
  if (rm_score.valid())
    scores = scores + guard_scores(rm_score.get().tensor("rm_scores"), "the reward model", s_.step + 1, clip, &clipped);
  const Config overlong = s_.cfg.subtree("reward_model.overlong_buffer");
  if (overlong.get<bool>("enable")) {
    // DAPO's soft overlong punishment: responses that run into the last `len` tokens lose up to penalty_factor.
    const auto lengths = gen.tensor("response_mask").to(torch::kFloat).sum(1);
    const auto penalty = algo::overlong_penalty(lengths, s_.specs.rollout.response_length, overlong.get<int64_t>("len"),
                                                overlong.get<double>("penalty_factor"));
    if (log && overlong.get<bool>("log")) s_.metrics->set("score/overlong_penalty_mean", mean_of(penalty));
    scores = scores + penalty;
  }
  if (clip) {
    scores = guard_scores(scores, "the summed score", s_.step + 1, clip, &clipped);
    if (log) s_.metrics->set("score/clipped", static_cast<double>(clipped));
  }
  return scores;
}

torch::Tensor TrainerStages::sequence_costs(const DataProto& gen, const Future& cost_score) {
  auto t = timer_.scope("cost");
  torch::Tensor costs = guard_scores(to_float_tensor(s_.rule_costs(gen)),
                                     "the cost (cost.type " + s_.cfg.get<std::string>("cost.type") + ")", s_.step + 1, {});
  if (cost_score.valid())
    costs = costs + guard_scores(cost_score.get().tensor("rm_scores"), "the cost model", s_.step + 1, {});
  return costs;
}

torch::Tensor TrainerStages::score(const Generation& generation) {
  return sequence_scores(wait_generation(generation.batch), generation.rm_score, /*log=*/false);
}

torch::Tensor TrainerStages::cost(const Generation& generation) {
  return sequence_costs(wait_generation(generation.batch), generation.cost_score);
}

Rollout TrainerStages::dispatch_readers(const Future& gen, int64_t n) {
  Rollout r;
  r.n = n;
  // verl's bypass mode: the rollout's own log-probs are the old policy's, so the actor's pass is skipped.
  if (!s_.cfg.get<bool>("algorithm.rollout_correction.bypass_mode")) r.old_log_prob = s_.actor->call("compute_log_prob", gen);
  if (s_.need_ref) r.ref_log_prob = s_.actor->call("compute_ref_log_prob", gen);
  if (s_.critic) r.values = s_.critic->call("compute_values", gen);
  if (s_.cost_critic) r.cost_values = s_.cost_critic->call("compute_values", gen);
  return r;
}

Rollout TrainerStages::rollout(const DataProto& prompts) {
  Generation g = generate(prompts);
  // Everything that only reads the rollout is dispatched at once; the pools run it concurrently.
  Rollout r = dispatch_readers(g.batch, s_.specs.rollout.n);
  r.prompts = prompts;
  r.rm_score = g.rm_score;
  r.cost_score = g.cost_score;
  r.batch = wait_generation(g.batch);
  stamp_policy_version(r.batch);
  log_reshard(r.batch, *s_.metrics);
  return r;
}

Rollout TrainerStages::rollout_of(const DataProto& generated, int64_t n, const torch::Tensor& scores) {
  HF_CHECK(n >= 1 && generated.batch_size() % n == 0, "rollout_of: ", generated.batch_size(),
           " rows are not whole groups of n = ", n);
  HF_CHECK(!scores.defined() || scores.numel() == generated.batch_size(), "rollout_of: ", scores.numel(),
           " scores for ", generated.batch_size(), " rows");
  DataProto batch = generated;
  stamp_policy_version(batch);
  log_reshard(batch, *s_.metrics);
  Rollout r = dispatch_readers(Future::ready(batch), n);
  r.scores = scores;
  if (s_.reward_model && !scores.defined()) r.rm_score = s_.reward_model->call("compute_rm_score", batch);
  if (s_.cost_model) r.cost_score = s_.cost_model->call("compute_rm_score", batch);
  r.batch = std::move(batch);
  return r;
}

DataProto TrainerStages::concat(const std::vector<DataProto>& generated) {
  HF_CHECK(!generated.empty(), "concat: no generated batches");
  int64_t width = 0;  // prompt width = all tokens - response tokens
  for (const auto& g : generated)
    width = std::max(width, g.tensor("input_ids").size(1) - g.tensor("responses").size(1));
  std::vector<DataProto> parts;
  for (const auto& g : generated) parts.push_back(left_pad_prompts(g, width, s_.tokenizer.pad_id()));
  return DataProto::concat(parts);
}

void TrainerStages::score(Rollout& r) {
  if (!r.scores.defined()) r.scores = sequence_scores(r.batch, r.rm_score, /*log=*/true);
  MetricsLog& m = *s_.metrics;
  if (r.rm_score.valid()) m.set("score/rm_mean", mean_of(r.rm_score.get().tensor("rm_scores")));
  m.set("score/mean", mean_of(r.scores));
  m.set("score/max", r.scores.max().item<double>());
  m.set("score/min", r.scores.min().item<double>());
}

void TrainerStages::cost(Rollout& r) {
  r.costs = sequence_costs(r.batch, r.cost_score);
  s_.metrics->set("cost/mean", mean_of(r.costs));
}

void TrainerStages::collect(Rollout& r) {
  if (r.old_log_prob.valid()) {
    auto t = timer_.scope("old_log_prob");
    r.batch.update(r.old_log_prob.get());
  } else {
    HF_CHECK(r.batch.has_tensor("rollout_log_probs"), "collect: algorithm.rollout_correction.bypass_mode takes the ",
             "old log-probs from the rollout, but the batch has no rollout_log_probs");
    r.batch.set_tensor("old_log_probs", r.batch.tensor("rollout_log_probs") *
                                            r.batch.tensor("response_mask").to(torch::kFloat));
  }
  // The generating policy against the one about to train (another dtype, or one update behind): logged,
  // and with algorithm.rollout_correction.rollout_is the actor's loss is weighted by the truncated ratio.
  if (r.batch.has_tensor("rollout_log_probs") && r.batch.has_tensor("old_log_probs")) {
    const auto correction = algo::rollout_correction(
        r.batch.tensor("old_log_probs"), r.batch.tensor("rollout_log_probs"), r.batch.tensor("response_mask"),
        algo::rollout_correction_config(s_.cfg.subtree("algorithm")));
    for (const auto& [key, value] : correction.metrics) s_.metrics->set(key, value);
    if (correction.weights.defined()) r.batch.set_tensor("rollout_is_weights", correction.weights);
  }
  if (r.ref_log_prob.valid()) {
    auto t = timer_.scope("ref");
    r.batch.update(r.ref_log_prob.get());
  }
  if (r.values.valid()) {
    auto t = timer_.scope("values");
    r.batch.update(r.values.get());
  }
  if (r.cost_values.valid()) {
    auto t = timer_.scope("cost_values");
    r.batch.set_tensor("cost_values", r.cost_values.get().tensor("values"));
  }
}

torch::Tensor TrainerStages::token_rewards(Rollout& r) {
  HF_CHECK(r.scores.defined(), "token_rewards: score the rollout first (rl.score(r))");
  const auto mask = r.batch.tensor("response_mask").to(torch::kFloat);
  torch::Tensor rewards = scores_at_last_token(r.scores, mask);
  if (s_.cfg.get<bool>("algorithm.use_kl_in_reward")) {
    HF_CHECK(r.batch.has_tensor("ref_log_prob"), "token_rewards: algorithm.use_kl_in_reward needs the reference ",
             "log-probs; collect the rollout first (rl.collect(r))");
    MetricsLog& m = *s_.metrics;
    auto kl = algo::apply_kl_penalty(rewards, r.batch.tensor("old_log_probs"), r.batch.tensor("ref_log_prob"), mask,
                                     s_.kl_ctrl.value(), algo::reward_kl_type(s_.cfg.subtree("algorithm")));
    rewards = kl.token_level_rewards;
    m.set("actor/reward_kl_penalty", kl.mean_kl.item<double>());
    m.set("actor/reward_kl_coef", s_.kl_ctrl.value());
    s_.kl_ctrl.update(kl.mean_kl.item<double>(), static_cast<double>(r.batch.batch_size()));
  }
  r.batch.set_tensor("token_level_rewards", rewards);
  return rewards;
}

algo::AdvantageInput TrainerStages::advantage_input(const Rollout& r, const torch::Tensor& token_rewards) {
  algo::AdvantageInput in = algo::advantage_params(s_.cfg.subtree("algorithm"));
  in.token_level_rewards = token_rewards;
  in.response_mask = r.batch.tensor("response_mask").to(torch::kFloat);
  in.index = torch::arange(r.batch.batch_size() / r.n, torch::kLong).repeat_interleave(r.n);
  if (r.batch.has_tensor("values")) in.values = r.batch.tensor("values");
  return in;
}

algo::AdvantageOutput TrainerStages::advantage(const std::string& estimator, const algo::AdvantageInput& in) {
  auto t = timer_.scope("advantage");
  ControllerSpan span(*s_.timeline, "advantage");
  return algo::compute_advantage(estimator, in);
}

void TrainerStages::set_advantages(Rollout& r, const algo::AdvantageOutput& adv) {
  r.batch.set_tensor("advantages", adv.advantages.to(torch::kFloat));
  r.batch.set_tensor("returns", adv.returns.to(torch::kFloat));
}

void TrainerStages::set_cost_advantages(Rollout& r, const algo::AdvantageOutput& cost_adv) {
  r.batch.set_tensor("cost_returns", cost_adv.returns.to(torch::kFloat));
  s_.metrics->set("cost_advantages/mean",
                  algo::masked_mean(cost_adv.advantages, r.batch.tensor("response_mask").to(torch::kFloat)).item<double>());
}

void TrainerStages::update(Rollout& r) {
  const DataProto& batch = r.batch;
  HF_CHECK(batch.has_tensor("advantages"), "update: set the rollout's advantages first (rl.set_advantages)");
  // Critic and actor dispatched together: they overlap when they live in different pools.
  // Each role's LR schedule sits at this RL step, however many optimizer steps the update takes.
  auto at_this_step = [&](DataProto b) {
    b.meta()["schedule_step"] = s_.step;
    return b;
  };
  Future critic_f, cost_critic_f;
  if (s_.critic)
    critic_f = s_.critic->call("update_critic", at_this_step(batch.select({"input_ids", "attention_mask", "responses",
                                                                           "response_mask", "values", "returns"})));
  if (s_.cost_critic) {
    HF_CHECK(batch.has_tensor("cost_returns"), "update: the cost critic needs cost returns (rl.set_cost_advantages)");
    DataProto cost_batch = batch.select({"input_ids", "attention_mask", "responses", "response_mask"});
    cost_batch.set_tensor("values", batch.tensor("cost_values"));
    cost_batch.set_tensor("returns", batch.tensor("cost_returns"));
    cost_critic_f = s_.cost_critic->call("update_critic", at_this_step(cost_batch));
  }
  std::vector<std::string> actor_keys = {"input_ids", "attention_mask", "responses", "response_mask",
                                         "old_log_probs", "advantages"};
  if (batch.has_tensor("ref_log_prob")) actor_keys.push_back("ref_log_prob");
  if (batch.has_tensor("rollout_is_weights")) actor_keys.push_back("rollout_is_weights");
  Future actor_f = s_.actor->call("update_actor", at_this_step(batch.select(actor_keys)));
  MetricsLog& m = *s_.metrics;
  int nonfinite = 0;  // roles whose update met a non-finite gradient norm and skipped that optimizer step
  if (critic_f.valid()) {
    auto t = timer_.scope("update_critic");
    nonfinite += add_metrics(m, critic_f);
  }
  if (cost_critic_f.valid()) {  // the critic worker names its metrics critic/*; these are the cost critic's
    auto t = timer_.scope("update_cost_critic");
    nonfinite += add_metrics(m, cost_critic_f, "cost_");
  }
  {
    auto t = timer_.scope("update_actor");
    nonfinite += add_metrics(m, actor_f);
  }
  // The new weights to the standalone rollout pool, straight from the actor's processes; finish() waits.
  if (s_.rollout) weight_sync_ = s_.dispatch_weight_sync(s_.step + 1);
  m.set("train/nonfinite_updates", nonfinite);
  if (nonfinite > 0)
    log_warn("step ", s_.step + 1, ": ", nonfinite, " role update(s) had a non-finite gradient norm and skipped ",
             "their optimizer step (see <role>/skipped_steps and the losses in the metrics)");
}

nlohmann::json TrainerStages::finish(Rollout& r) {
  MetricsLog& m = *s_.metrics;
  const DataProto& batch = r.batch;
  if (weight_sync_) {  // with staleness 1 this also waits for the next step's generation, queued before it
    auto t = timer_.scope("weight_sync");
    const nlohmann::json figures = s_.finish_weight_sync(*weight_sync_);
    for (const auto& [key, value] : figures.items()) m.set(key, value.get<double>());
    m.set("weight_sync/policy_version", static_cast<double>(s_.step + 1));
    weight_sync_.reset();
  }
  if (batch.has_tensor("policy_version")) {
    const auto staleness = (s_.step - batch.tensor("policy_version")).to(torch::kDouble);
    m.set("rollout/staleness_mean", staleness.mean().item<double>());
    m.set("rollout/staleness_max", staleness.max().item<double>());
  }
  const auto response_mask = batch.tensor("response_mask").to(torch::kFloat);
  const auto lengths = response_mask.sum(1);
  if (batch.has_tensor("token_level_rewards")) m.set("reward/mean", mean_of(batch.tensor("token_level_rewards").sum(1)));
  if (batch.has_tensor("advantages"))
    m.set("advantages/mean", algo::masked_mean(batch.tensor("advantages"), response_mask).item<double>());
  if (batch.has_tensor("returns"))
    m.set("returns/mean", algo::masked_mean(batch.tensor("returns"), response_mask).item<double>());
  if (batch.has_tensor("values"))
    m.set("values/mean", algo::masked_mean(batch.tensor("values"), response_mask).item<double>());
  if (batch.has_tensor("ref_log_prob"))
    m.set("actor/ref_kl",
          algo::masked_mean(batch.tensor("old_log_probs") - batch.tensor("ref_log_prob"), response_mask).item<double>());
  m.set("response_length/mean", mean_of(lengths));
  m.set("response_length/max", lengths.max().item<double>());
  // A batch generated before the stages saw it (rollout_of) has no prompt batch: its prompt lengths are
  // the attended tokens that are not response.
  const auto prompt_lengths = r.prompts.batch_size() > 0 ? r.prompts.tensor("attention_mask").sum(1).to(torch::kFloat)
                                                         : batch.tensor("attention_mask").sum(1).to(torch::kFloat) - lengths;
  m.set("prompt_length/mean", mean_of(prompt_lengths));
  const double tokens = batch.tensor("attention_mask").sum().item<double>();
  m.set("perf/total_tokens", tokens);
  const Traffic traffic = s_.controller.take_traffic();  // tensor bytes: what the data plane keeps off the controller
  m.set("perf/controller_bytes", static_cast<double>(traffic.controller_bytes()));
  m.set("perf/worker_to_worker_bytes", static_cast<double>(traffic.worker_to_worker_bytes));
  m.set("perf/throughput_tokens_per_s", tokens / std::max(1e-9, timer_.total_seconds()));
  m.add_timings(timer_);
  // Held-out greedy score every trainer.test_freq steps (verl's name), after this step's update.
  const int64_t test_freq = s_.cfg.get<int64_t>("trainer.test_freq");
  if (test_freq > 0 && (s_.step + 1) % test_freq == 0 && s_.cfg.get<int64_t>("data.test_size") > 0)
    m.set("val/score", s_.evaluate(s_.cfg.get<int64_t>("data.test_size")));
  s_.log_memory(m);
  log_samples(r, s_.step + 1);
  log_timeline(s_.step + 1);
  nlohmann::json record = m.end_step(++s_.step);
  // After the metrics line: a checkpoint of step N always has step N's metrics on disk before it.
  const int64_t save_freq = s_.cfg.get<int64_t>("trainer.save_freq");
  if (save_freq > 0 && s_.step % save_freq == 0) s_.save_checkpoint();
  finished_ = true;
  return record;
}

}  // namespace hybridflow
