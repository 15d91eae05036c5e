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
    if (!spec.spawn_workers) ranks[r].pid = m.meta.value("pid", -1);
    Message welcome{"welcome", {{"pool", spec.name}, {"node", node_of(r)}, {"object_table_bytes", spec.object_table_bytes}},
                    std::nullopt};
    // Workers we did not spawn do not die with us; they leave when our heartbeats stop.
    if (!spec.spawn_workers) welcome.meta["heartbeat_timeout_s"] = spec.heartbeat_timeout_s;
    outbox.emplace_back(r, std::move(welcome));
    wake.notify();
    ranks[r].last_seen = Clock::now();
    cv.notify_all();
    return;
  }
  if (!ranks[rank].connected || ranks[rank].identity != received.identity)
    return reject(received, "unbound-peer",
                  detail::concat("'", printable(m.kind, 32), "' for rank ", rank, " from a peer that is not its connection"));
  link->commit(received);
  ranks[rank].last_seen = Clock::now();
  if (m.kind == "heartbeat") {
    ranks[rank].objects = m.meta.value("objects", int64_t{0});
    ranks[rank].object_bytes = m.meta.value("object_bytes", int64_t{0});
    ranks[rank].data_rejected = m.meta.value("data_rejected", size_t{0});
    return;
  }
  worker_bytes += m.meta.value("fetched_bytes", uint64_t{0});
  const int64_t id = m.meta.value("call_id", int64_t(-1));
  auto it = pending.find(id);
  if (it == pending.end() || !it->second.addressed[rank]) {
    log_debug("resource pool '", spec.name, "': reply for finished call ", id, " from rank ", rank);
    return;
  }
  Pending& p = it->second;
  if (m.kind == "error") {
    std::string message = detail::concat("worker group '", p.role, "' ", where(rank), " failed in method '",
                                         p.method, "': ", m.meta.value("message", "?"));
    auto on_error = std::move(p.on_error);
    pending.erase(it);
    callbacks.push_back([on_error, message] { on_error(std::make_exception_ptr(Error(message))); });
    return;
  }
  if (p.replies[rank]) return;
  p.replies[rank] = std::move(m);
  if (--p.remaining > 0) return;
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
          if (ranks[r].connected) to_send.emplace_back(static_cast<int>(r), Message{"heartbeat", {}, std::nullopt});
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
        sent_tensor_bytes += bytes.tensors;
      }
    }

    std::string problem = check_health();
    if (!problem.empty()) fail(problem);

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
      Pending p;
      p.role = role;
      p.method = method;
      p.replies.resize(ranks.size());
      p.addressed.assign(ranks.size(), false);
      for (size_t r = 0; r < messages.size(); ++r) p.addressed[r] = messages[r].has_value();
      p.remaining = static_cast<int>(std::count(p.addressed.begin(), p.addressed.end(), true));
      p.deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                      std::chrono::duration<double>(spec.call_timeout_s));
      p.on_done = std::move(on_done);
      p.on_error = std::move(on_error);
      pending.emplace(id, std::move(p));
      for (size_t r = 0; r < messages.size(); ++r) {
        if (!messages[r]) continue;
        Message& content = messages[r]->shared ? messages[r]->shared->message : *messages[r];
        content.kind = kind;
        content.meta["call_id"] = id;
        outbox.emplace_back(static_cast<int>(r), std::move(*messages[r]));
      }
      wake.notify();
      return;
    }
  }
  on_error(std::make_exception_ptr(
      Error(detail::concat("resource pool '", spec.name, "' cannot run '", role, ".", method, "': ", why))));
}
}  // namespace hybridflow
