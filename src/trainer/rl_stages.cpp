// The step an RL program runs in (trainer/rl_program.h), over the trainer's worker groups: prompts,
// generation, advantages and the end of the step (metrics, evaluation, weight sync, checkpoint cadence),
// so that a program holds only its dataflow. The role handles' calls are in rl_roles.cpp.
#include "rl_stages.h"

#include <limits>

#include "hybridflow/core/logging.h"
#include "hybridflow/engine/weight_sync.h"
#include "hybridflow/parallel/store_server.h"
#include "hybridflow/workers/rl_batch.h"
#include "hybridflow/workers/agent_rollout.h"
#include "hybridflow/workers/data_parallel.h"

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
  // Expert parallelism: the experts' part of the figures above, on its own.
  if (gen.value("expert_model_bytes", int64_t{0}) > 0) {
    m.set("reshard/expert_model_bytes", gen.at("expert_model_bytes").get<double>());
    m.set("reshard/to_generation_expert_bytes_sent", gen.at("expert_bytes_sent").get<double>());
    m.set("reshard/to_generation_expert_bytes_received", gen.at("expert_bytes_received").get<double>());
    m.set("reshard/expert_peak_extra_weight_bytes", gen.at("expert_peak_extra_weight_bytes").get<double>());
    m.set("reshard/expert_redundant_bytes", gen.at("expert_redundant_bytes").get<double>());
  }
}

// The rollout's KV cache as the first replica reported it, out of the meta like the reshard's: its peak
// bytes every step, and once per run the pool and how many sequences of the longest length fit in it.
void log_kv_cache(DataProto& rollout, MetricsLog& m, bool* said) {
  if (!rollout.meta().contains("kv_cache")) return;
  const nlohmann::json kv = rollout.meta().at("kv_cache");
  rollout.meta().erase("kv_cache");
  m.set("memory/rollout_kv_cache_peak_bytes", kv.at("peak_bytes").get<double>());
  // Prefix caching: prompt positions that started on other prompts' blocks instead of being prefilled.
  m.set("rollout/prefix_cached_tokens", kv.value("prefix_cached_tokens", 0.0));
  // CUDA graphs: how many this rollout captured (the rest it took from the last one: free_cache_engine false)
  // and how many of its decode steps they replayed.
  if (kv.value("decode_graphs", int64_t{0}) > 0) {
    m.set("rollout/decode_graphs_captured",
          static_cast<double>(kv.at("decode_graphs").get<int64_t>() - kv.at("decode_graphs_taken").get<int64_t>()));
    m.set("rollout/decode_graph_steps", kv.at("graph_steps").get<double>());
  }
  if (*said) return;
  *said = true;
  const int64_t pool = kv.at("pool_blocks").get<int64_t>();
  const std::string layout = pool > 0 ? "paged, a pool of " + std::to_string(pool) + " blocks (" +
                                             std::to_string(kv.at("peak_blocks").get<int64_t>()) +
                                             " in use at the first rollout's peak)"
                                       : std::string("one slot per sequence");
  const int64_t fit = kv.at("sequences_fit").get<int64_t>();
  // The static batch (expert-parallel decoding, or continuous batching off) reports no cache figures.
  if (pool == 0 && fit == 0)
    log_info("rollout KV cache: the static batch, one slab row per sequence");
  else
    log_info("rollout KV cache: ", layout, "; ", fit, " sequences of prompt + response length fit at once");
}

// The staleness histogram: the share of `staleness` (per sample or per token) at each of 0..k updates.
void log_staleness_shares(const at::Tensor& staleness, int64_t k, const std::string& prefix, MetricsLog& m) {
  for (int64_t d = 0; d <= k; ++d)
    m.set(prefix + std::to_string(d), (staleness == static_cast<double>(d)).to(torch::kDouble).mean().item<double>());
}

// Partial rollouts: staleness per response token (the updates between the version that drew it and the
// policy this step trains), the share of tokens older than that policy, and the sequences that changed
// weights mid-generation. A token more than k updates old would break the bound the run promises.
void log_token_staleness(const DataProto& batch, int64_t step, int64_t k, MetricsLog& m) {
  const auto mask = batch.tensor("response_mask").to(torch::kCPU) > 0;
  const auto versions = batch.tensor("token_policy_version").to(torch::kCPU);
  const auto staleness = (step - versions.masked_select(mask)).to(torch::kDouble);
  if (staleness.numel() == 0) return;
  const double most = staleness.max().item<double>();
  HF_CHECK(most <= static_cast<double>(k), "step ", step + 1, ": a response token was drawn by policy version ",
           step - static_cast<int64_t>(most), ", more than actor_rollout_ref.rollout.staleness = ", k,
           " updates before the policy it trains");
  m.set("rollout/token_staleness_mean", staleness.mean().item<double>());
  m.set("rollout/token_staleness_max", most);
  m.set("rollout/stale_token_fraction", (staleness > 0).to(torch::kDouble).mean().item<double>());
  log_staleness_shares(staleness, k, "rollout/token_staleness_share_", m);
  const int64_t big = std::numeric_limits<int64_t>::max();
  const auto first = std::get<0>(versions.masked_fill(~mask, big).min(1));
  const auto last = std::get<0>(versions.masked_fill(~mask, -1).max(1));
  m.set("rollout/resumed_sequences", ((first != last) & mask.any(1)).sum().item<double>());
}

// A multi-turn rollout's metrics (agent/...) over every sample's episode, whichever replica ran it. The engine's
// counters (prefill and reused positions, peak and shared KV blocks, decode steps) exist only per replica and
// the collected batch keeps the first replica's meta, so those are the first replica's; the episode metrics
// logged after them cover every replica. The summaries then leave the meta.
void log_agent_episodes(DataProto& rollout, MetricsLog& m) {
  if (rollout.meta().contains("agent")) {
    for (const auto& [name, value] : rollout.meta().at("agent").items())
      if (value.is_number()) m.set(name, value.get<double>());
    rollout.meta().erase("agent");
  }
  if (!rollout.has_field("agent_episode")) return;
  const nlohmann::json metrics = agent_episode_metrics(rollout.field("agent_episode"));
  for (const auto& [name, value] : metrics.items()) m.set(name, value.get<double>());
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
const RunSpec& TrainerStages::spec() const { return s_.run; }

MetricsLog& TrainerStages::metrics() { return *s_.metrics; }

int64_t TrainerStages::step() const { return s_.step; }

const std::string& TrainerStages::adv_estimator() const { return s_.run.algorithm.adv_estimator; }

RolloutBatchState& TrainerStages::state_of(const RolloutBatch& batch) {
  HF_CHECK(batch.valid(), "algorithm program: a RolloutBatch that no generation made (default-constructed)");
  return *batch.state_;
}

algo::LagrangeMultiplier& TrainerStages::lagrange() {
  HF_CHECK(s_.lagrange.has_value(), "algorithm program '", s_.run.algorithm.program,
           "' uses the Safe-RLHF multiplier, but no cost is configured (cost_model.enable or cost.type)");
  return *s_.lagrange;
}

DataProto TrainerStages::next_prompts(int64_t count) {
  if (count <= 0) count = s_.run.data.train_batch_size;
  const bool first = !drew_prompts_;
  drew_prompts_ = true;
  // Off-policy: an earlier step drew this step's prompts and is generating them already.
  if (first && !s_.prefetch.empty() && s_.prefetch.front().for_step == s_.step) {
    const DataProto& drawn = s_.prefetch.front().prompts;
    HF_CHECK(count == drawn.batch_size(), "algorithm program '", s_.run.algorithm.program, "': its first ",
             "next_prompts(", count, ") differs from the ", drawn.batch_size(),
             " prompts an earlier step generated for it (actor_rollout_ref.rollout.staleness ", s_.placement.staleness,
             ")");
    return drawn;
  }
  return s_.next_prompts(count, s_.train, &s_.data_pos, s_.run.data.shuffle);
}

DataProto TrainerStages::generation_request(const DataProto& prompts, int64_t step, uint64_t round) const {
  DataProto request = prompts;
  // The first sampled generation of a step keeps the seed of the one-generation programs; a program that
  // samples again in the same step (DAPO) draws fresh samples.
  const uint64_t seed = s_.run.trainer.seed;
  request.meta()["seed"] = seed * 100003ULL + static_cast<uint64_t>(step) + 7777777ULL * round;
  if (streams_groups() && round == 0) {
    // The pool starts the next step's prompts in the slots this call's short responses free
    // (workers/rollout_worker.h), once published (send_sampled) and within the staleness bound.
    int64_t longest = 0;
    for (const EncodedPrompt& p : s_.train) longest = std::max<int64_t>(longest, static_cast<int64_t>(p.ids.size()));
    request.meta()["stream_step"] = step;
    request.meta()["stream_staleness"] = s_.placement.staleness;
    request.meta()["stream_max_prompt_length"] = longest;
    request.meta()["stream_has_next"] = step + 1 < s_.run.trainer.total_steps;
  }
  return request;
}

bool TrainerStages::streams_groups() const { return s_.streams_groups(); }

Future TrainerStages::send_sampled(const DataProto& request, int64_t step) {
  if (!streams_groups()) return s_.generator().call("generate_sequences", request);
  std::vector<StreamPrompt> prompts = stream_prompts_of_request(request, step);
  const nlohmann::json published = {{"prompts", stream_prompts_json(prompts)}};
  s_.stream_pending.add(std::move(prompts));
  Future sent = s_.generator().call("generate_sequences", s_.as_sent(request));
  // Published once it is queued behind the call before it, which may start its prompts.
  s_.weight_sync_store->set(kRolloutStreamKeyPrefix + std::to_string(step), published.dump());
  return sent;
}

Future TrainerStages::sampled_generation(const DataProto& prompts, uint64_t round) {
  WorkerGroup& generator = s_.generator();
  if (s_.placement.staleness == 0 || round > 0)
    return generator.call("generate_sequences", generation_request(prompts, s_.step, round));
  Future batch;
  if (!s_.prefetch.empty() && s_.prefetch.front().for_step == s_.step) {
    HF_CHECK(prompts.serialize() == s_.prefetch.front().prompts.serialize(), "algorithm program '",
             s_.run.algorithm.program, "': with actor_rollout_ref.rollout.staleness ", s_.placement.staleness,
             " its first sampled generation must be of the prompts its first next_prompts() returned (an earlier ",
             "step generated those)");
    batch = s_.prefetch.front().batch;
    s_.prefetch.pop_front();
  } else {
    HF_CHECK(s_.prefetch.empty(), "sampled_generation: the buffered rollouts are for step ",
             s_.prefetch.front().for_step, " on, not step ", s_.step);
    batch = send_sampled(generation_request(prompts, s_.step, round), s_.step);
  }
  // The rollout pool runs ahead: the rollout of every later step whose samples, generated with the weights
  // the pool holds now (version v), would be at most k updates old when trained (step <= v + k). Queued
  // behind one another on the pool, they run while this step's log-probs, values and updates do; the
  // buffer is full (the pool pauses) until the next weight sync raises v.
  int64_t next_step = s_.prefetch.empty() ? s_.step + 1 : s_.prefetch.back().for_step + 1;
  for (; next_step < s_.run.trainer.total_steps && next_step <= s_.rollout_version + s_.placement.staleness;
       ++next_step) {
    RLTrainer::State::Prefetch next;
    next.for_step = next_step;
    next.prompts = s_.next_prompts(s_.run.data.train_batch_size, s_.train, &s_.data_pos, s_.run.data.shuffle);
    next.request = generation_request(next.prompts, next.for_step, 0);
    next.batch = send_sampled(next.request, next_step);
    s_.prefetch.push_back(std::move(next));
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
  DataProto request = prompts;
  if (decoding == Decoding::kGreedy) {
    request.meta()["greedy"] = true;
    request.meta()["n"] = 1;
    b->generation = s_.generator().call("generate_sequences", request);
    b->greedy = true;
  } else {
    request = generation_request(prompts, s_.step, sampled_generations_);
    b->generation = sampled_generation(prompts, sampled_generations_++);
    b->n = s_.specs.rollout.n;
  }
  if (s_.rollout) {  // a standalone rollout pool whose workers die generates it again (trainer.max_rollout_restarts)
    auto t = timer_.scope("generate");
    b->generation = s_.surviving_rollout_deaths(b->generation, request);
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
    log_kv_cache(b.data, *s_.metrics, &s_.kv_cache_logged);
    log_agent_episodes(b.data, *s_.metrics);
    // rollout.stream_groups: the batch's groups that an earlier call had begun, those drawn for later steps,
    // the groups left in the rollout process, and those started again for being too old.
    if (b.data.meta().contains("stream_returned")) {
      s_.stream_pending.note_reply(b.data);
      for (const char* key : {"streamed_groups", "stream_groups_ahead", "stream_groups_carried", "stream_groups_restarted"})
        s_.metrics->set(std::string("rollout/") + key, b.data.meta().value(key, 0.0));
    }
  }
  return b.data;
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
  log_kv_cache(b->data, *s_.metrics, &s_.kv_cache_logged);
  log_agent_episodes(b->data, *s_.metrics);
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
  if (s_.run.algorithm.use_kl_in_reward) {
    HF_CHECK(data.has_tensor("ref_log_prob"), "advantage_input: algorithm.use_kl_in_reward needs the reference ",
             "log-probs; join ref->compute_log_prob first");
    MetricsLog& m = *s_.metrics;
    auto kl = algo::apply_kl_penalty(rewards, data.tensor("old_log_probs"), data.tensor("ref_log_prob"), mask,
                                     s_.kl_ctrl.value(), s_.run.algorithm.reward_kl_type);
    rewards = kl.token_level_rewards;
    m.set("actor/reward_kl_penalty", kl.mean_kl.item<double>());
    m.set("actor/reward_kl_coef", s_.kl_ctrl.value());
    s_.kl_ctrl.update(kl.mean_kl.item<double>(), static_cast<double>(data.batch_size()));
  }
  data.set_tensor("token_level_rewards", rewards);
  return rewards;
}

namespace {

algo::AdvantageInput advantage_input_of(const AlgorithmSpec& algorithm, const DataProto& data, int64_t n,
                                        const torch::Tensor& token_rewards) {
  algo::AdvantageInput in = algorithm.advantage;
  in.token_level_rewards = token_rewards;
  in.response_mask = data.tensor("response_mask").to(torch::kFloat);
  in.index = torch::arange(data.batch_size() / n, torch::kLong).repeat_interleave(n);
  if (data.has_tensor("values")) in.values = data.tensor("values");
  // The optimal token baseline's per-position weights.
  for (const auto& [key, field] : {std::pair{"old_log_probs", &in.old_log_probs}, std::pair{"sum_pi_squared", &in.sum_pi_squared},
                                   std::pair{"rollout_is_weights", &in.rollout_is_weights}})
    if (data.has_tensor(key)) *field = data.tensor(key);
  return in;
}

}  // namespace

algo::AdvantageInput TrainerStages::advantage_input(RolloutBatch& batch) {
  RolloutBatchState& b = state_of(batch);
  const torch::Tensor rewards = token_rewards(b);
  return advantage_input_of(s_.run.algorithm, b.data, b.n, rewards);
}

algo::AdvantageInput TrainerStages::cost_advantage_input(RolloutBatch& batch) {
  RolloutBatchState& b = state_of(batch);
  HF_CHECK(b.costs.defined(), "cost_advantage_input: join the batch's cost first (cost->compute_cost)");
  const DataProto& data = wait_generation(b);
  algo::AdvantageInput in =
      advantage_input_of(s_.run.algorithm, data, b.n, scores_at_last_token(b.costs, data.tensor("response_mask").to(torch::kFloat)));
  in.values = data.has_tensor("cost_values") ? data.tensor("cost_values") : torch::Tensor();
  return in;
}

algo::AdvantageOutput TrainerStages::advantage(const std::string& estimator, const algo::AdvantageInput& in) {
  auto t = timer_.scope("advantage");
  ControllerSpan span(*s_.timeline, "advantage");
  return algo::compute_advantage(estimator, in);
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
  if (weight_sync_) {  // off-policy this also waits for the rollouts queued before it on the pool
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
    // Off-policy only, so that an on-policy run's record stays as it was.
    if (s_.placement.staleness > 0) log_staleness_shares(staleness, s_.placement.staleness, "rollout/staleness_share_", m);
  }
  if (batch.has_tensor("token_policy_version")) log_token_staleness(batch, s_.step, s_.placement.staleness, m);
  // The buffer's occupancy as the step ends: the rollouts of later steps generated or generating (<= k).
  if (s_.rollout && s_.placement.staleness > 0) m.set("rollout/buffer_batches", static_cast<double>(s_.prefetch.size()));
  if (s_.run.trainer.max_rollout_restarts > 0) m.set("rollout/restarts", static_cast<double>(s_.rollout_restarts));
  // The trainer's wait for the standalone rollout pool: for its batch, and at the weight sync.
  if (s_.rollout) m.set("timing/trainer_idle_s", timer_.seconds("generate") + timer_.seconds("weight_sync"));
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
  m.set("response_length/min", lengths.min().item<double>());
  // verl's: the share of responses that ran out of budget instead of ending.
  m.set("response_length/clip_ratio",
        mean_of((lengths >= static_cast<double>(s_.specs.rollout.response_length)).to(torch::kFloat)));
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
  s_.end_profile();  // the step's own calls: not the held-out scoring below
  // Held-out greedy score every trainer.test_freq steps (verl's name), after this step's update.
  const int64_t test_freq = s_.run.trainer.test_freq;
  if (test_freq > 0 && (s_.step + 1) % test_freq == 0 && s_.run.data.test_size > 0) {
    // Between trigger_parameter_sync_step syncs the rollout pool holds older weights: the held-out score is
    // the trained policy's.
    if (s_.rollout && s_.rollout_version != s_.step + 1) s_.finish_weight_sync(s_.dispatch_weight_sync(s_.step + 1));
    m.set("val/score", s_.evaluate(s_.run.data.test_size, s_.step + 1, &m));
  }
  // Partial rollouts stop for a checkpoint now: the memory figures below wait for the rollout pool, which
  // would otherwise finish the generations in flight first.
  const int64_t save_freq = s_.run.trainer.save_freq;
  const bool saves = save_freq > 0 && (s_.step + 1) % save_freq == 0;
  if (saves) s_.pause_partial_rollouts();
  s_.log_memory(m);
  log_samples(r, s_.step + 1);
  dump_rollout(r, s_.step + 1);
  log_timeline(s_.step + 1);
  nlohmann::json record = m.end_step(++s_.step);
  // After the metrics line: a checkpoint of step N always has step N's metrics on disk before it.
  if (saves) s_.save_checkpoint();
  finished_ = true;
  return record;
}

}  // namespace hybridflow
