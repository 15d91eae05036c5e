// The parts of the trainer that depend on where roles run (placement/placement_spec.h): the weight sync to
// a standalone rollout pool, the per-pool memory figures, and the in-flight rollouts of off-policy
// training (rollout.staleness k) that a checkpoint carries.
#include <algorithm>

#include "hybridflow/core/process_memory.h"
#include "hybridflow/parallel/store_server.h"
#include "hybridflow/workers/partial_rollout_state.h"
#include "hybridflow/workers/weight_sync_link.h"
#include "rl_trainer_state.h"

namespace hybridflow {

namespace {

constexpr const char* kInFlightFile = "rollout_in_flight.bin";
constexpr const char* kInFlightPromptsFile = "rollout_in_flight_prompts.bin";
// Partial rollouts: a generation the checkpoint stopped between two tokens, as the request that continues it.
constexpr const char* kPartialFile = "rollout_partial.bin";

// The i-th buffered rollout's file: the first keeps the name of one-step off-policy checkpoints.
std::string in_flight_file(const std::string& dir, size_t i, const char* name) {
  const std::string suffix = i == 0 ? "" : "." + std::to_string(i);
  return dir + "/" + name + suffix;
}
std::string in_flight_file(const std::string& dir, size_t i, bool prompts) {
  return in_flight_file(dir, i, prompts ? kInFlightPromptsFile : kInFlightFile);
}


}  // namespace

void RLTrainer::State::connect_weight_sync(const WeightSyncLayout& layout, int64_t bucket_megabytes,
                                           const std::string& dtype) {
  HF_CHECK(rollout, "connect_weight_sync: no standalone rollout pool");
  HF_CHECK(bucket_megabytes >= 1, "actor_rollout_ref.rollout.update_weights_bucket_megabytes must be >= 1, got ",
           bucket_megabytes);
  // Like a worker group's own store: in this process, on the address the pools listen on.
  weight_sync_store = StoreServer::start(0, std::chrono::seconds(60), actor->pool().spec().bind_host);
  nlohmann::json link = {{"store_port", weight_sync_store->port()},
                         {"world_size", layout.world()},
                         {"layout", weight_sync_layout_json(layout)},
                         {"bucket_bytes", bucket_megabytes << 20},
                         {"dtype", dtype}};
  DataProto to_actor, to_rollout;
  link["rank_offset"] = 0;
  to_actor.meta()["weight_sync"] = link;
  link["rank_offset"] = layout.actor_world();
  to_rollout.meta()["weight_sync"] = link;
  // Both sides join at once: the rendezvous waits for every rank of both pools.
  wait_all({actor->call("join_weight_sync", to_actor), rollout->call("join_weight_sync", to_rollout)});
}

void RLTrainer::State::connect_rollout_weight_sync() {
  WeightSyncLayout link;
  link.actor_tp = specs.actor.layout.tp;
  link.actor_pp = specs.actor.layout.pp;
  link.actor_dp = specs.actor.dp;
  link.rollout_tp = specs.standalone_rollout->layout.tp;
  link.rollout_replicas = specs.standalone_rollout->dp;
  const RolloutSpec& spec = specs.standalone_rollout->spec;
  connect_weight_sync(link, spec.update_weights_bucket_megabytes, spec.dtype);
}

RLTrainer::State::WeightSyncCalls RLTrainer::State::dispatch_weight_sync(int64_t version) {
  rollout_version = version;  // what the rollout holds for every generation queued after this sync
  // Partial rollouts: the generations queued before this sync take it between two tokens (announced
  // before the actor sends, so that a rank that sees it finds the sender on its way).
  if (specs.rollout.partial_rollout) weight_sync_store->set(kWeightSyncAnnounceKey, std::to_string(version));
  DataProto version_meta;
  version_meta.meta()["policy_version"] = version;
  return {actor->call("send_weights"), rollout->call("receive_weights", version_meta)};
}

nlohmann::json RLTrainer::State::finish_weight_sync(const WeightSyncCalls& calls) {
  try {
    wait_all({calls.send, calls.receive});
  } catch (const Error&) {
    if (auto restarted = recover_rollout()) return *restarted;
    throw;
  }
  double bytes = 0, buckets = 0, seconds = 0;
  for (const DataProto& rank : calls.receive.per_rank()) {
    const auto& s = rank.meta().at("weight_sync");
    bytes += s.at("bytes_received").get<double>();
    buckets += s.at("buckets").get<double>();
  }
  for (const Future* f : {&calls.send, &calls.receive})
    for (const DataProto& rank : f->per_rank())
      seconds = std::max(seconds, rank.meta().at("weight_sync").at("seconds").get<double>());
  return {{"weight_sync/bytes", bytes}, {"weight_sync/buckets", buckets}, {"weight_sync/transfer_s", seconds}};
}

void RLTrainer::State::log_memory(MetricsLog& metrics) {
  // A rollout pool that died since it was last waited for is restarted here, at the latest, every step.
  for (;;) {
    try {
      log_pool_memory(metrics);
      return;
    } catch (const Error&) {
      if (!recover_rollout()) throw;
    }
  }
}

void RLTrainer::State::log_pool_memory(MetricsLog& metrics) {
  // One call per pool to any role it hosts (they share the processes), all pools at once; not recorded in
  // the timeline, which shows the algorithm's calls.
  std::vector<std::pair<std::string, Future>> asked;
  for (const PoolSpec& pool : placement.pools) {
    const std::string& role = pool.roles.front();
    WorkerGroup* group = role == "actor" ? actor.get() : role == "rollout" ? rollout.get() : role == "critic" ? critic.get()
                       : role == "cost_critic" ? cost_critic.get() : role == "reward_model" ? reward_model.get()
                                                                        : cost_model.get();
    if (!group) continue;
    WorkerGroup quiet = *group;
    quiet.record_calls(nullptr);
    asked.emplace_back(pool.name, quiet.call("memory_stats"));
  }
  for (const auto& [pool, reply] : asked) {
    int64_t peak = 0, rss = 0, cuda_peak = -1;
    for (const DataProto& rank : reply.per_rank()) {
      peak = std::max(peak, rank.tensor("peak_rss_bytes")[0].item<int64_t>());
      rss = std::max(rss, rank.tensor("rss_bytes")[0].item<int64_t>());
      cuda_peak = std::max(cuda_peak, rank.tensor("cuda_peak_bytes")[0].item<int64_t>());
    }
    metrics.set("memory/" + pool + "/peak_rss_bytes", static_cast<double>(peak));
    metrics.set("memory/" + pool + "/rss_bytes", static_cast<double>(rss));
    if (cuda_peak >= 0) metrics.set("memory/" + pool + "/cuda_peak_bytes", static_cast<double>(cuda_peak));
  }
  metrics.set("memory/controller/peak_rss_bytes", static_cast<double>(process_memory().peak_rss_bytes));
}

void RLTrainer::State::save_prefetch(const std::string& dir) {
  // Each buffered rollout is waited for and saved (its prompts were drawn: data_pos is past them), so the
  // checkpoint holds what older weights generated rather than regenerating it with weights it no longer has.
  // Partial rollouts do not wait for the end: the generations in flight stopped between two tokens (those
  // not begun, before their first) when the checkpoint began (pause_partial_rollouts), the checkpoint keeps
  // their tokens, and they go on from there, here and in a run resumed from it, through the same
  // continuation (a prefill of each prefix with the weights the pool holds).
  std::vector<size_t> stopped;
  for (size_t i = 0; i < prefetch.size(); ++i) {
    prefetch[i].batch = surviving_rollout_deaths(prefetch[i].batch, prefetch[i].request);
    const DataProto& got = prefetch[i].batch.get();
    if (is_partial_rollout_state(got)) {
      prefetch[i].request = continuation_request(prefetch[i].request, got);
      write_file_atomic(in_flight_file(dir, i, kPartialFile), prefetch[i].request.serialize());
      stopped.push_back(i);
    } else {
      stream_pending.note_reply(got);
      write_file_atomic(in_flight_file(dir, i, false), got.serialize());
    }
    write_file_atomic(in_flight_file(dir, i, true), prefetch[i].prompts.serialize());
  }
  // rollout.stream_groups: a reply returns as many groups as its request sent prompts, so once every reply
  // is in, no prompt is pending and the rollout process carries no begun sample the checkpoint would miss.
  HF_CHECK(stream_pending.size() == 0, "save_prefetch: ", stream_pending.size(), " streamed prompts were sent to ",
           "the rollout pool and returned by none of the replies the checkpoint holds");
  resume_partial_rollouts();
  // With partial rollouts the pool leaves a checkpoint on its weights, as a run resumed from it starts: the
  // stopped generations continue on the same weights here and there, and the buffer fills alike.
  if (specs.rollout.partial_rollout && rollout && rollout_version != step) finish_weight_sync(dispatch_weight_sync(step));
  for (size_t i : stopped) prefetch[i].batch = rollout->call("generate_sequences", prefetch[i].request);
}

void RLTrainer::State::pause_partial_rollouts() {
  rollouts_paused = specs.rollout.partial_rollout && rollout && !prefetch.empty();
  if (rollouts_paused) weight_sync_store->set(kRolloutPauseKey, "1");
}

void RLTrainer::State::resume_partial_rollouts() {
  if (rollouts_paused) weight_sync_store->set(kRolloutPauseKey, "0");
  rollouts_paused = false;
}

void RLTrainer::State::continue_saved_partial_rollouts() {
  for (Prefetch& p : prefetch)
    if (!p.batch.valid()) p.batch = rollout->call("generate_sequences", p.request);
}

namespace {

DataProto read_in_flight_file(const std::string& path) {
  std::string bytes = read_file(path);
  try {
    return DataProto::deserialize(std::move(bytes));
  } catch (const std::exception& e) {
    HF_FAIL(path, ": not a readable in-flight rollout (", e.what(), "); the checkpoint is damaged");
  }
}

}  // namespace

void RLTrainer::State::load_prefetch(const std::string& dir) {
  prefetch.clear();
  size_t saved = 0;
  while (file_exists(in_flight_file(dir, saved, false)) || file_exists(in_flight_file(dir, saved, kPartialFile))) ++saved;
  // This run trains step `step` + i on buffered rollout i; beyond its staleness they would be too old.
  const size_t kept = std::min(saved, static_cast<size_t>(placement.staleness));
  if (kept < saved)
    log_warn(dir, " holds ", saved, " in-flight rollout(s) (", kInFlightFile, "...); with ",
             "actor_rollout_ref.rollout.staleness ", placement.staleness, " this run takes ", kept,
             ", so the prompts of the other ", saved - kept, " are skipped");
  for (size_t i = 0; i < kept; ++i) {
    Prefetch p;
    p.for_step = step + static_cast<int64_t>(i);
    p.prompts = read_in_flight_file(in_flight_file(dir, i, true));
    const std::string partial = in_flight_file(dir, i, kPartialFile);
    if (file_exists(partial)) {
      // Continued once the rollout pool holds this run's weights (continue_saved_partial_rollouts).
      p.request = read_in_flight_file(partial);
      HF_CHECK(specs.rollout.partial_rollout && rollout, partial, " holds the partial responses of a rollout that ",
               "was in flight, which only a run with actor_rollout_ref.rollout.partial_rollout: true continues");
      HF_CHECK(holds_partial_responses(p.request) && p.request.batch_size() == p.prompts.batch_size() &&
                   p.request.tensor("input_ids").equal(p.prompts.tensor("input_ids")),
               partial, ": expected the request of the prompts in ", in_flight_file(dir, i, true),
               " with their partial responses");
      partial_sequences_of(p.request, specs.rollout.n, specs.rollout.response_length, step, partial);
    } else {
      p.batch = Future::ready(read_in_flight_file(in_flight_file(dir, i, false)));
    }
    prefetch.push_back(std::move(p));
  }
}

}  // namespace hybridflow
