// The step an RL program runs in (trainer/rl_program.h) and the work behind its role handles
// (trainer/rl_roles.h), over the trainer's worker groups. Here live the futures, the timing of every wait,
// the step's metrics and the checkpoint cadence, so that a program holds only its dataflow.
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

}  // namespace

TrainerStages::TrainerStages(RLTrainer::State& s)
    : s_(s),
      roles_{ActorRollout(*this), std::nullopt, std::nullopt, Reward(*this), std::nullopt, std::nullopt},
      step_start_(CallSpan::Clock::now()),
      step_start_unix_s_(std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count()) {
  s_.timeline->take();  // calls made between steps (evaluation, checkpoints) are not this step's
  s_.controller.take_traffic();  // nor their bytes
  if (s_.need_ref) roles_.ref = Reference(*this);
  if (s_.critic) roles_.critic = Critic(*this, /*of_cost=*/false);
  if (s_.lagrange) roles_.cost = Cost(*this);
  if (s_.cost_critic) roles_.cost_critic = Critic(*this, /*of_cost=*/true);
}

const Config& TrainerStages::config() const { return s_.cfg; }

MetricsLog& TrainerStages::metrics() { return *s_.metrics; }

int64_t TrainerStages::step() const { return s_.step; }

const std::string& TrainerStages::adv_estimator() const { return s_.adv_estimator; }

RolloutBatchState& TrainerStages::state_of(const RolloutBatch& batch) {
  HF_CHECK(batch.valid(), "algorithm program: a RolloutBatch that no generation made (default-constructed)");
  return *batch.state_;
}

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

RolloutBatch TrainerStages::generate(const DataProto& prompts, Decoding decoding) {
  auto b = std::make_shared<RolloutBatchState>();
  b->step = this;
  b->prompts = prompts;
  if (decoding == Decoding::kGreedy) {
    DataProto request = prompts;
    request.meta()["greedy"] = true;
    request.meta()["n"] = 1;
    b->generation = s_.generator().call("generate_sequences", request);
    b->greedy = true;
  } else {
    b->generation = sampled_generation(prompts, sampled_generations_++);
    b->n = s_.cfg.get<int64_t>("actor_rollout_ref.rollout.n");
  }
  return RolloutBatch(std::move(b));
}

DataProto& TrainerStages::wait_generation(RolloutBatchState& b) {
  if (b.waited) return b.data;
  {
    auto t = timer_.scope("generate");
    b.data = b.generation.get();
  }
  b.waited = true;
  if (!b.greedy) {
    stamp_policy_version(b.data);
    log_reshard(b.data, *s_.metrics);
  }
  return b.data;
}

torch::Tensor TrainerStages::sequence_scores(const DataProto& gen, const Future& rm_score,
                                             std::map<std::string, double>& parts) {
  auto t = timer_.scope("reward");
  const auto clip = reward_clip_from_config(s_.cfg);
  int64_t clipped = 0;
  torch::Tensor scores;
  {
    ControllerSpan span(*s_.timeline, "rule_score");
    scores = guard_scores(to_float_tensor(s_.rule_scores(gen)), "the rule reward (reward.type " +
                          s_.cfg.get<std::string>("reward.type") + ")", s_.step + 1, clip, &clipped);
  }
  parts["score/rule_mean"] = mean_of(scores);
  if (rm_score.valid()) {
    parts["score/rm_mean"] = mean_of(rm_score.get().tensor("rm_scores"));
    scores = scores + guard_scores(rm_score.get().tensor("rm_scores"), "the reward model", s_.step + 1, clip, &clipped);
  }
  const Config overlong = s_.cfg.subtree("reward_model.overlong_buffer");
  if (overlong.get<bool>("enable")) {
    // DAPO's soft overlong punishment: responses that run into the last `len` tokens lose up to penalty_factor.
    const auto lengths = gen.tensor("response_mask").to(torch::kFloat).sum(1);
    const auto penalty = algo::overlong_penalty(lengths, rl_response_length(s_.cfg), overlong.get<int64_t>("len"),
                                                overlong.get<double>("penalty_factor"));
    if (overlong.get<bool>("log")) parts["score/overlong_penalty_mean"] = mean_of(penalty);
    scores = scores + penalty;
  }
  if (clip) {
    scores = guard_scores(scores, "the summed score", s_.step + 1, clip, &clipped);
    parts["score/clipped"] = static_cast<double>(clipped);
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

Pending TrainerStages::reward(const RolloutBatch& batch) {
  auto b = batch.state_;
  state_of(batch);
  if (b->scores.defined()) return Pending();  // scored when it was made (batch_of)
  Future rm_score;
  if (s_.reward_model) rm_score = s_.reward_model->call("compute_rm_score", b->generation);
  return Pending([this, b, rm_score] { b->scores = sequence_scores(wait_generation(*b), rm_score, b->score_metrics); });
}

Pending TrainerStages::cost(const RolloutBatch& batch) {
  auto b = batch.state_;
  state_of(batch);
  Future cost_score;
  if (s_.cost_model) cost_score = s_.cost_model->call("compute_rm_score", b->generation);
  return Pending([this, b, cost_score] { b->costs = sequence_costs(wait_generation(*b), cost_score); });
}

Pending TrainerStages::old_log_prob(const RolloutBatch& batch) {
  auto b = batch.state_;
  state_of(batch);
  // verl's bypass mode: the rollout's own log-probs are the old policy's, so the actor's pass is skipped.
  Future log_prob;
  if (!s_.cfg.get<bool>("algorithm.rollout_correction.bypass_mode"))
    log_prob = s_.actor->call("compute_log_prob", b->generation);
  return Pending([this, b, log_prob] {
    DataProto& data = wait_generation(*b);
    if (log_prob.valid()) {
      auto t = timer_.scope("old_log_prob");
      data.update(log_prob.get());
    } else {
      HF_CHECK(data.has_tensor("rollout_log_probs"), "compute_log_prob: algorithm.rollout_correction.bypass_mode ",
               "takes the old log-probs from the rollout, but the batch has no rollout_log_probs");
      data.set_tensor("old_log_probs", data.tensor("rollout_log_probs") * data.tensor("response_mask").to(torch::kFloat));
    }
    // The generating policy against the one about to train (another dtype, or one update behind): logged,
    // and with algorithm.rollout_correction.rollout_is the actor's loss is weighted by the truncated ratio.
    if (data.has_tensor("rollout_log_probs") && data.has_tensor("old_log_probs")) {
      const auto correction = algo::rollout_correction(
          data.tensor("old_log_probs"), data.tensor("rollout_log_probs"), data.tensor("response_mask"),
          algo::rollout_correction_config(s_.cfg.subtree("algorithm")));
      for (const auto& [key, value] : correction.metrics) s_.metrics->set(key, value);
      if (correction.weights.defined()) data.set_tensor("rollout_is_weights", correction.weights);
    }
  });
}

Pending TrainerStages::ref_log_prob(const RolloutBatch& batch) {
  auto b = batch.state_;
  state_of(batch);
  Future log_prob = s_.actor->call("compute_ref_log_prob", b->generation);
  return Pending([this, b, log_prob] {
    DataProto& data = wait_generation(*b);
    auto t = timer_.scope("ref");
    data.update(log_prob.get());
  });
}

Pending TrainerStages::values(const RolloutBatch& batch, bool of_cost) {
  auto b = batch.state_;
  state_of(batch);
  Future result = (of_cost ? s_.cost_critic : s_.critic)->call("compute_values", b->generation);
  return Pending([this, b, result, of_cost] {
    DataProto& data = wait_generation(*b);
    auto t = timer_.scope(of_cost ? "cost_values" : "values");
    if (of_cost)
      data.set_tensor("cost_values", result.get().tensor("values"));
    else
      data.update(result.get());
  });
}

RolloutBatch TrainerStages::batch_of(const DataProto& generated, int64_t n, const torch::Tensor& scores) {
  HF_CHECK(n >= 1 && generated.batch_size() % n == 0, "batch_of: ", generated.batch_size(),
           " rows are not whole groups of n = ", n);
  HF_CHECK(!scores.defined() || scores.numel() == generated.batch_size(), "batch_of: ", scores.numel(),
           " scores for ", generated.batch_size(), " rows");
  auto b = std::make_shared<RolloutBatchState>();
  b->step = this;
  b->n = n;
  b->data = generated;
  stamp_policy_version(b->data);
  log_reshard(b->data, *s_.metrics);
  b->generation = Future::ready(b->data);
  b->waited = true;
  b->scores = scores;
  return RolloutBatch(std::move(b));
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

torch::Tensor TrainerStages::token_rewards(RolloutBatchState& b) {
  HF_CHECK(b.scores.defined(), "advantage_input: join the batch's reward first (reward.compute_reward)");
  DataProto& data = wait_generation(b);
  const auto mask = data.tensor("response_mask").to(torch::kFloat);
  torch::Tensor rewards = scores_at_last_token(b.scores, mask);
  if (s_.cfg.get<bool>("algorithm.use_kl_in_reward")) {
    HF_CHECK(data.has_tensor("ref_log_prob"), "advantage_input: algorithm.use_kl_in_reward needs the reference ",
             "log-probs; join ref->compute_log_prob first");
    MetricsLog& m = *s_.metrics;
    auto kl = algo::apply_kl_penalty(rewards, data.tensor("old_log_probs"), data.tensor("ref_log_prob"), mask,
                                     s_.kl_ctrl.value(), algo::reward_kl_type(s_.cfg.subtree("algorithm")));
    rewards = kl.token_level_rewards;
    m.set("actor/reward_kl_penalty", kl.mean_kl.item<double>());
    m.set("actor/reward_kl_coef", s_.kl_ctrl.value());
    s_.kl_ctrl.update(kl.mean_kl.item<double>(), static_cast<double>(data.batch_size()));
  }
  data.set_tensor("token_level_rewards", rewards);
  return rewards;
}

namespace {

algo::AdvantageInput advantage_input_of(const Config& cfg, const DataProto& data, int64_t n,
                                        const torch::Tensor& token_rewards) {
  algo::AdvantageInput in = algo::advantage_params(cfg.subtree("algorithm"));
  in.token_level_rewards = token_rewards;
  in.response_mask = data.tensor("response_mask").to(torch::kFloat);
  in.index = torch::arange(data.batch_size() / n, torch::kLong).repeat_interleave(n);
  if (data.has_tensor("values")) in.values = data.tensor("values");
  return in;
}

}  // namespace

algo::AdvantageInput TrainerStages::advantage_input(RolloutBatch& batch) {
  RolloutBatchState& b = state_of(batch);
  const torch::Tensor rewards = token_rewards(b);
  return advantage_input_of(s_.cfg, b.data, b.n, rewards);
}

algo::AdvantageInput TrainerStages::cost_advantage_input(RolloutBatch& batch) {
  RolloutBatchState& b = state_of(batch);
  HF_CHECK(b.costs.defined(), "cost_advantage_input: join the batch's cost first (cost->compute_cost)");
  const DataProto& data = wait_generation(b);
  algo::AdvantageInput in =
      advantage_input_of(s_.cfg, data, b.n, scores_at_last_token(b.costs, data.tensor("response_mask").to(torch::kFloat)));
  in.values = data.has_tensor("cost_values") ? data.tensor("cost_values") : torch::Tensor();
  return in;
}

algo::AdvantageOutput TrainerStages::advantage(const std::string& estimator, const algo::AdvantageInput& in) {
  auto t = timer_.scope("advantage");
  ControllerSpan span(*s_.timeline, "advantage");
  return algo::compute_advantage(estimator, in);
}

void TrainerStages::add_update_metrics(const Future& update, const std::string& rename_prefix) {
  bool skipped = false;
  for (const auto& [k, v] : update.get().meta().at("metrics").items()) {
    // JSON has no NaN or inf: a worker's non-finite loss or gradient norm arrives as null.
    s_.metrics->set(!rename_prefix.empty() && k.rfind("critic/", 0) == 0 ? rename_prefix + k : k,
                    v.is_number() ? v.get<double>() : std::nan(""));
    skipped = skipped || (k.size() >= 13 && k.compare(k.size() - 13, 13, "skipped_steps") == 0);
  }
  ++updates_;
  nonfinite_updates_ += skipped;
}

namespace {

// Each role's LR schedule sits at this RL step, however many optimizer steps the update takes.
DataProto at_schedule_step(DataProto batch, int64_t step) {
  batch.meta()["schedule_step"] = step;
  return batch;
}

}  // namespace

Pending TrainerStages::update_critic(const RolloutBatch& batch, bool of_cost) {
  RolloutBatchState& b = state_of(batch);
  const DataProto& data = wait_generation(b);
  Future update;
  if (of_cost) {
    HF_CHECK(data.has_tensor("cost_returns"), "update_critic: the cost critic needs cost returns ",
             "(batch.set_cost_advantages)");
    DataProto cost_batch = data.select({"input_ids", "attention_mask", "responses", "response_mask"});
    cost_batch.set_tensor("values", data.tensor("cost_values"));
    cost_batch.set_tensor("returns", data.tensor("cost_returns"));
    update = s_.cost_critic->call("update_critic", at_schedule_step(cost_batch, s_.step));
  } else {
    HF_CHECK(data.has_tensor("returns"), "update_critic: set the batch's advantages first (batch.set_advantages)");
    update = s_.critic->call("update_critic", at_schedule_step(data.select({"input_ids", "attention_mask", "responses",
                                                                           "response_mask", "values", "returns"}),
                                                               s_.step));
  }
  return Pending([this, update, of_cost] {
    auto t = timer_.scope(of_cost ? "update_cost_critic" : "update_critic");
    // The critic worker names its metrics critic/*; the cost critic's become cost_critic/*.
    add_update_metrics(update, of_cost ? "cost_" : "");
  });
}

Pending TrainerStages::update_actor(const RolloutBatch& batch) {
  RolloutBatchState& b = state_of(batch);
  const DataProto& data = wait_generation(b);
  HF_CHECK(data.has_tensor("advantages"), "update_actor: set the batch's advantages first (batch.set_advantages)");
  std::vector<std::string> keys = {"input_ids", "attention_mask", "responses", "response_mask",
                                   "old_log_probs", "advantages"};
  if (data.has_tensor("ref_log_prob")) keys.push_back("ref_log_prob");
  if (data.has_tensor("rollout_is_weights")) keys.push_back("rollout_is_weights");
  Future update = s_.actor->call("update_actor", at_schedule_step(data.select(keys), s_.step));
  return Pending([this, update] {
    {
      auto t = timer_.scope("update_actor");
      add_update_metrics(update);
    }
    // The new weights to the standalone rollout pool, straight from the actor's processes; finish() waits.
    if (s_.rollout) weight_sync_ = s_.dispatch_weight_sync(s_.step + 1);
  });
}

nlohmann::json TrainerStages::finish(RolloutBatch& trained) {
  RolloutBatchState& r = state_of(trained);
  MetricsLog& m = *s_.metrics;
  const DataProto& batch = wait_generation(r);
  // The scores and costs of the batch trained on (a program's other batches, baselines and DAPO's rounds,
  // are not the step's rollout).
  for (const auto& [key, value] : r.score_metrics) m.set(key, value);
  if (r.scores.defined()) {
    m.set("score/mean", mean_of(r.scores));
    m.set("score/max", r.scores.max().item<double>());
    m.set("score/min", r.scores.min().item<double>());
  }
  if (r.costs.defined()) m.set("cost/mean", mean_of(r.costs));
  if (updates_ > 0) {
    m.set("train/nonfinite_updates", nonfinite_updates_);
    if (nonfinite_updates_ > 0)
      log_warn("step ", s_.step + 1, ": ", nonfinite_updates_, " role update(s) had a non-finite gradient norm and ",
               "skipped their optimizer step (see <role>/skipped_steps and the losses in the metrics)");
  }
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
  // A batch generated before the step saw it (batch_of) has no prompt batch: its prompt lengths are
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
