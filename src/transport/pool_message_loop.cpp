// A pool's I/O thread: the only user of its socket. Authenticated messages in (hellos bind a rank to
// its connection; replies complete pending calls), queued messages out, then a health check.
#include <signal.h>

#include <algorithm>

#include "hybridflow/core/error.h"
#include "hybridflow/core/logging.h"
#include "hybridflow/core/printable.h"
#include "pool_impl.h"

namespace hybridflow {

void ProcessPool::Impl::handle(transport_detail::Received& received, std::vector<std::function<void()>>& callbacks) {
  if (!received.message) return reject(received, received.reject_code, received.rejected_reason);
  Message& m = *received.message;
  if (m.kind != "heartbeat") {
    message_bytes += received.bytes;
    ++messages;
    received_tensor_bytes += received.tensor_bytes;
  }
  std::lock_guard<std::mutex> lock(mutex);
  // The sender's rank is authenticated; the ZeroMQ identity it speaks from is bound at its hello.
  const int rank = received.sender;
  if (rank >= static_cast<int>(ranks.size()))
    return reject(received, "unknown-rank",
                  detail::concat("rank ", rank, " is not a rank of this pool (", ranks.size(), " ranks)"));
  if (m.kind == "hello") {
    const int r = rank;
    if (ranks[r].connected) {
      if (ranks[r].identity == received.identity) return;  // a repeated hello
      return reject(received, "taken-rank",
                    detail::concat("rank ", r, " already connected from another peer; a second joiner is refused"));
    }
    link->commit(received);
    ranks[r].connected = true;
    ranks[r].identity = received.identity;
    ranks[r].host = printable(m.meta.value("host", "?"), 64);
    ranks[r].data_endpoint = m.meta.value("data_endpoint", std::string());
    link->set_peer_machine(r, m.meta.value("machine", std::string()));  // its calls' big tensors: shared memory?
    if (!spec.spawn_workers) ranks[r].pid = m.meta.value("pid", -1);
    if (m.meta.contains("pid") && m.meta["pid"].is_number_integer()) ranks[r].process_pid = m.meta["pid"].get<int64_t>();
    ranks[r].takes_batches = m.meta.contains("batches") && m.meta["batches"].is_boolean() && m.meta["batches"].get<bool>();
    Message welcome{"welcome", {{"pool", spec.name}, {"node", node_of(r)}, {"object_table_bytes", spec.object_table_bytes}},
                    std::nullopt};
    // Workers we did not spawn do not die with us; they leave when our heartbeats stop.
    if (!spec.spawn_workers) welcome.meta["heartbeat_timeout_s"] = spec.heartbeat_timeout_s;
    outbox.emplace_back(r, std::move(welcome));
    wake.notify();
    ranks[r].last_seen = Clock::now();
    if (std::all_of(ranks.begin(), ranks.end(), [](const RankState& s) { return s.connected; })) group_ranks_by_process();
    cv.notify_all();
    return;
  }
  if (!ranks[rank].connected || ranks[rank].identity != received.identity)
    return reject(received, "unbound-peer",
                  detail::concat("'", printable(m.kind, 32), "' for rank ", rank, " from a peer that is not its connection"));
  link->commit(received);
  ranks[rank].last_seen = Clock::now();
  if (m.kind == "heartbeat") {
    // A worker process of several ranks beats once for all of them: "also" has the other ranks' figures, each
    // of a rank that shares the sender's process (its hello said so), else the message is refused.
    try {
      const auto also = m.meta.value("also", nlohmann::json::array());
      for (const auto& other : also) {
        const int r = other.at("rank").get<int>();
        if (r < 0 || r >= static_cast<int>(ranks.size()) || r == rank || !ranks[r].connected ||
            ranks[rank].process_pid < 0 || ranks[r].process_pid != ranks[rank].process_pid ||
            ranks[r].host != ranks[rank].host)
          return reject(received, "foreign-rank",
                        detail::concat("heartbeat of rank ", rank, " names rank ", r,
                                       ", which is not a connected rank of its process"));
      }
      auto note = [&](RankState& state, const nlohmann::json& figures) {
        state.last_seen = ranks[rank].last_seen;
        state.objects = figures.value("objects", int64_t{0});
        state.object_bytes = figures.value("object_bytes", int64_t{0});
        state.data_rejected = figures.value("data_rejected", size_t{0});
      };
      note(ranks[rank], m.meta);
      for (const auto& other : also) note(ranks[other.at("rank").get<int>()], other);
    } catch (const std::exception& e) {
      return reject(received, "malformed", "undecodable heartbeat: " + printable(e.what()));
    }
    return;
  }
  if (m.kind == "results") return handle_batch_results(received, m, rank, callbacks);
  worker_bytes += m.meta.value("fetched_bytes", uint64_t{0});
  const int64_t id = m.meta.value("call_id", int64_t(-1));
  auto it = pending.find(id);
  if (it == pending.end() || !it->second.addressed[rank]) {
    log_debug("resource pool '", spec.name, "': reply for finished call ", id, " from rank ", rank);
    return;
  }
  answer(it, rank, std::move(m), callbacks);
}

bool ProcessPool::Impl::answer(std::map<int64_t, Pending>::iterator it, int rank, Message m,
                               std::vector<std::function<void()>>& callbacks) {
  Pending& p = it->second;
  if (m.kind == "error") {
    std::string message = detail::concat("worker group '", p.role, "' ", where(rank), " failed in method '",
                                         p.method, "': ", m.meta.value("message", "?"));
    auto on_error = std::move(p.on_error);
    pending.erase(it);
    callbacks.push_back([on_error, message] { on_error(std::make_exception_ptr(Error(message))); });
    return true;
  }
  if (p.replies[rank]) return false;
  p.replies[rank] = std::move(m);
  if (--p.remaining > 0) return false;
  std::vector<Message> replies;
  for (auto& r : p.replies) replies.push_back(r ? std::move(*r) : Message{});
  auto on_done = std::move(p.on_done);
  auto on_error = std::move(p.on_error);
  pending.erase(it);
  auto shared = std::make_shared<std::vector<Message>>(std::move(replies));
  callbacks.push_back([on_done, on_error, shared] {
    try {
      on_done(std::move(*shared));
    } catch (...) {
      on_error(std::current_exception());
    }
  });
  return true;
}

void ProcessPool::Impl::handle_batch_results(transport_detail::Received& received, Message& m, int leader,
                                             std::vector<std::function<void()>>& callbacks) {
  const int64_t id = m.meta.value("call_id", int64_t(-1));
  auto it = pending.find(id);
  if (it == pending.end()) {
    log_debug("resource pool '", spec.name, "': merged reply for finished call ", id, " from rank ", leader);
    return;
  }
  const Pending& p = it->second;
  // Every part must be of a rank this call reached through `leader`: a rank answers only for its batch.
  std::vector<std::pair<int, Message>> replies;
  auto foreign = [&](int rank) {
    return rank < 0 || rank >= static_cast<int>(ranks.size()) || !p.addressed[rank] || p.via[rank] != leader;
  };
  auto reject_foreign = [&](int rank) {
    reject(received, "foreign-rank",
           detail::concat("merged reply of rank ", leader, " answers for rank ", rank,
                          ", which the call did not reach through it"));
  };
  try {
    // Ranks whose result is an empty DataProto and nothing else.
    for (const auto& entry : m.meta.value("done", nlohmann::json::array())) {
      const int rank = entry.get<int>();
      if (foreign(rank)) return reject_foreign(rank);
      replies.emplace_back(rank, Message{"result", nlohmann::json::object(), DataProto()});
    }
    for (const auto& part : m.meta.at("parts")) {
      const int rank = part.at("rank").get<int>();
      if (foreign(rank)) return reject_foreign(rank);
      if (part.value("separate", false)) continue;  // a big result: on the rank's own connection
      Message reply{part.at("kind").get<std::string>(), part.value("meta", nlohmann::json::object()), std::nullopt};
      if (reply.kind != "result" && reply.kind != "error")
        return reject(received, "malformed", "merged reply with a part of kind '" + printable(reply.kind, 32) + "'");
      if (part.contains("data")) {
        const std::string key = part.at("data").get<std::string>();
        if (key == "empty") {
          reply.data = DataProto();
        } else {
          HF_CHECK(m.data && m.data->has_tensor(key), "no carried result '", key, "'");
          const torch::Tensor& bytes = m.data->tensor(key);
          reply.data = DataProto::deserialize(
              std::string(static_cast<const char*>(bytes.data_ptr()), static_cast<size_t>(bytes.numel())));
        }
      }
      replies.emplace_back(rank, std::move(reply));
    }
  } catch (const std::exception& e) {
    return reject(received, "malformed", "undecodable merged reply: " + printable(e.what()));
  }
  for (auto& [rank, reply] : replies) {
    worker_bytes += reply.meta.value("fetched_bytes", uint64_t{0});
    if (answer(it, rank, std::move(reply), callbacks)) return;  // the call is over (done, or failed)
  }
}

void ProcessPool::Impl::group_ranks_by_process() {
  if (!spec.batch_calls) return;
  std::map<std::pair<std::string, int64_t>, std::vector<int>> processes;
  for (size_t r = 0; r < ranks.size(); ++r)
    if (ranks[r].takes_batches && ranks[r].process_pid > 0)
      processes[{ranks[r].host, ranks[r].process_pid}].push_back(static_cast<int>(r));
  for (const auto& [process, members] : processes)
    if (members.size() > 1)
      for (int r : members) ranks[r].batch_leader = members.front();
}

void ProcessPool::Impl::reject(const transport_detail::Received& received, const std::string& code, const std::string& why) {
  ++rejected;
  // Per connection: a stranger opening many connections is capped by RejectLog::kMaxKeys.
  reject_log->note(received.identity, code, "rejected a message from " + received.who() + ": " + why);
}

void ProcessPool::Impl::loop() {
  // Signals go to the other threads: this one's poll must not fail with EINTR when a graceful stop
  // (enable_graceful_stop_on_signals) lets the process live on after a signal.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) sigaddset(&stop_signals, sig);
  ::pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  try {
    if (spec.spawn_workers) spawn();
  } catch (const std::exception& e) {
    fail(e.what());
  }
  {
    std::lock_guard<std::mutex> lock(mutex);
    spawned = true;
  }
  cv.notify_all();
  while (true) {
    zmq::pollitem_t items[] = {{router.handle(), 0, ZMQ_POLLIN, 0}, {nullptr, wake.fd(), ZMQ_POLLIN, 0}};
    zmq::poll(items, 2, std::chrono::milliseconds(50));
    wake.drain();
    std::vector<std::function<void()>> callbacks;
    while (auto received = link->receive(router, true)) handle(*received, callbacks);
    for (auto& cb : callbacks) cb();

    std::deque<std::pair<int, Message>> to_send;
    {
      std::lock_guard<std::mutex> lock(mutex);
      to_send.swap(outbox);
      std::vector<int64_t> released;
      {
        std::lock_guard<std::mutex> release_lock(release_mutex);
        released.swap(releases);
      }
      if (!released.empty() && !stopping)
        for (size_t r = 0; r < ranks.size(); ++r)
          if (ranks[r].connected && ranks[r].alive)
            to_send.emplace_back(static_cast<int>(r), Message{"release", {{"objects", released}}, std::nullopt});
      const auto now = Clock::now();
      if (!spec.spawn_workers && now - last_heartbeat >= std::chrono::duration<double>(transport_detail::kHeartbeatPeriodS)) {
        last_heartbeat = now;
        for (size_t r = 0; r < ranks.size(); ++r)
          // One per worker process: its ranks count what any of them hears (worker_main.cpp).
          if (ranks[r].connected && (ranks[r].batch_leader < 0 || ranks[r].batch_leader == static_cast<int>(r)))
            to_send.emplace_back(static_cast<int>(r), Message{"heartbeat", {}, std::nullopt});
      }
    }
    for (auto& [rank, message] : to_send) {
      std::string identity;
      {
        std::lock_guard<std::mutex> lock(mutex);
        if (!ranks[rank].alive) continue;
        identity = ranks[rank].identity;
      }
      const auto bytes = link->send(router, identity, rank, message);
      if (message.kind != "heartbeat") {
        message_bytes += bytes.total;
        ++messages;
        sent_tensor_bytes += bytes.tensors;
      }
    }

    std::string problem = check_health();
    if (!problem.empty()) {
      fail(problem);
      link->forget_peers();  // no call of a failed pool is answered: its shared-memory files close
    }

    std::lock_guard<std::mutex> lock(mutex);
    if (exiting) {
      bool any_alive = false;
      for (auto& r : ranks) any_alive = any_alive || r.alive;
      if (!any_alive || Clock::now() > exit_deadline || !failure.empty()) break;
    }
  }
  kill_and_reap_all();
}

void ProcessPool::Impl::request(const std::string& kind, const std::string& role, const std::string& method,
             std::vector<std::optional<Message>> messages, std::function<void(std::vector<Message>&&)> on_done,
             std::function<void(std::exception_ptr)> on_error) {
  std::string why;
  {
    std::lock_guard<std::mutex> lock(mutex);
    why = failure.empty() ? "it was shut down" : "it failed earlier: " + failure;
    if (failure.empty() && !stopping) {
      const int64_t id = next_id++;
      Pending fresh;
      Pending& p = pending.emplace(id, std::move(fresh)).first->second;
      p.role = role;
      p.method = method;
      p.replies.resize(ranks.size());
      p.via.assign(ranks.size(), -1);
      p.addressed.assign(ranks.size(), false);
      for (size_t r = 0; r < messages.size(); ++r) p.addressed[r] = messages[r].has_value();
      p.remaining = static_cast<int>(std::count(p.addressed.begin(), p.addressed.end(), true));
      p.deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                      std::chrono::duration<double>(spec.call_timeout_s));
      p.on_done = std::move(on_done);
      p.on_error = std::move(on_error);
      for (size_t r = 0; r < messages.size(); ++r) {
        if (!messages[r]) continue;
        Message& content = messages[r]->shared ? messages[r]->shared->message : *messages[r];
        content.kind = kind;
        content.meta["call_id"] = id;
      }
      // Ranks sharing a process: a request they all get alike goes once per process, as a batch through the
      // leading rank ([rank, after] each); their other requests name the call before them too ("after").
      std::map<std::pair<int, transport_detail::SharedContent*>, nlohmann::json> batches;
      for (size_t r = 0; r < messages.size(); ++r) {
        if (!messages[r]) continue;
        RankState& rank = ranks[r];
        const bool ordered = rank.batch_leader >= 0 && kind != "fetch";  // a fetch is not a call: no order
        if (ordered && messages[r]->shared) {
          batches[{rank.batch_leader, messages[r]->shared.get()}].push_back({static_cast<int>(r), rank.last_call});
          rank.last_call = id;
          p.via[r] = rank.batch_leader;
          continue;
        }
        if (ordered) {
          messages[r]->meta["after"] = rank.last_call;
          rank.last_call = id;
        }
        outbox.emplace_back(static_cast<int>(r), std::move(*messages[r]));
      }
      for (auto& [to, list] : batches) {
        const Message& content = to.second->message;
        Message batch{content.kind, content.meta, content.data};
        batch.meta["ranks"] = std::move(list);
        outbox.emplace_back(to.first, std::move(batch));
      }
      wake.notify();
      return;
    }
  }
  on_error(std::make_exception_ptr(
      Error(detail::concat("resource pool '", spec.name, "' cannot run '", role, ".", method, "': ", why))));
}
}  // namespace hybridflow
