// Worker side of a launch: ask the controller rank which pool to serve, and set up the environment of
// that pool's worker.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "hybridflow/core/printable.h"
#include "launcher_detail.h"

namespace hybridflow::transport_detail {

std::optional<int> run_launched_worker(const LaunchSettings& settings) {
  using Clock = std::chrono::steady_clock;
  const int rank = settings.env.rank;
  const std::string where = settings.endpoint(settings.rendezvous_port);
  const char* connect_env = std::getenv("HF_WORKER_CONNECT_TIMEOUT_S");
  const double connect_timeout_s = connect_env ? std::atof(connect_env) : 120.0;

  zmq::context_t context(1);
  zmq::socket_t socket(context, zmq::socket_type::dealer);
  socket.set(zmq::sockopt::linger, 0);
  // A random identity: kept across reconnects, and no stranger can take it before this rank connects.
  socket.set(zmq::sockopt::routing_id, "launch" + std::to_string(rank) + "-" + random_secret().substr(0, 16));
  Link::limit(socket);
  socket.connect(where);  // ZeroMQ keeps retrying until the controller listens
  Link link(settings.token, "launch", rank);
  RejectLog rejects("launch rank " + std::to_string(rank));

  const Message join{"join",
                     {{"rank", rank},
                      {"world_size", settings.env.world_size},
                      {"pid", static_cast<int64_t>(::getpid())},
                      {"host", host_name()}},
                     std::nullopt};
  const auto started = Clock::now();
  auto last_answer = started;
  auto last_ping = started - std::chrono::hours(1);
  bool answered = false;
  double silence_limit_s = 30;
  while (true) {
    const auto now = Clock::now();
    if (now - last_ping >= std::chrono::milliseconds(100)) {
      link.send(socket, "", kControllerEnd, join);
      last_ping = now;
    }
    zmq::pollitem_t items[] = {{socket.handle(), 0, ZMQ_POLLIN, 0}};
    zmq::poll(items, 1, std::chrono::milliseconds(50));
    while (auto received = link.receive(socket, false)) {
      if (!received->message) {  // not from our job's controller
        rejects.note(received->peer_address, received->reject_code,
                     "rejected a message from " + received->who() + ": " + received->rejected_reason);
        continue;
      }
      const Message& m = *received->message;
      answered = true;
      last_answer = Clock::now();
      silence_limit_s = m.meta.value("heartbeat_timeout_s", silence_limit_s);
      if (m.kind == "assign") {
        ::setenv(kEndpointEnv, m.meta.at("endpoint").get<std::string>().c_str(), 1);
        ::setenv(kTokenEnv, settings.token.c_str(), 1);
        ::setenv(kRankEnv, std::to_string(m.meta.at("pool_rank").get<int>()).c_str(), 1);
        ::setenv(kPoolEnv, m.meta.at("pool").get<std::string>().c_str(), 1);
        ::setenv(kLaunchRankEnv, std::to_string(rank).c_str(), 1);
        ::setenv(kControllerAddrEnv, settings.env.master_addr.c_str(), 1);
        // The pool's worker environment (thread counts, ...): set before any library reads it.
        // Only known keys (thread counts, device selection): even an authenticated assignment must not
        // set PATH or LD_PRELOAD here.
        const nlohmann::json env = m.meta.value("env", nlohmann::json::object());
        for (const auto& [key, value] : env.items()) {
          if (!pool_env_key_allowed(key) || !value.is_string()) {
            std::fprintf(stderr, "hybridflow launch rank %d: ignoring worker environment key '%s' (not an allowed "
                         "key, see docs/security.md)\n", rank, printable(key, 64).c_str());
            continue;
          }
          ::setenv(key.c_str(), value.get<std::string>().c_str(), 1);
        }
        socket.close();
        context.close();
        return std::nullopt;  // the caller serves the pool
      }
      if (m.kind == "release") return m.meta.value("exit_code", 0);
      if (m.kind == "refuse") {
        std::fprintf(stderr, "hybridflow launch rank %d: the controller at %s refused it: %s\n", rank, where.c_str(),
                     m.meta.value("message", std::string("?")).c_str());
        return 1;
      }
    }
    const double waited = std::chrono::duration<double>(Clock::now() - (answered ? last_answer : started)).count();
    if (!answered && waited > connect_timeout_s) {
      std::fprintf(stderr, "hybridflow launch rank %d: no controller answered at %s within %.0f s "
                   "(HF_WORKER_CONNECT_TIMEOUT_S; the same job secret, HF_JOB_TOKEN or HF_JOB_TOKEN_FILE, on every rank?); exiting\n", rank, where.c_str(),
                   connect_timeout_s);
      return 1;
    }
    if (answered && waited > silence_limit_s) {
      std::fprintf(stderr, "hybridflow launch rank %d: the controller at %s stopped answering for %.1f s; "
                   "exiting\n", rank, where.c_str(), waited);
      return 1;
    }
  }
}

}  // namespace hybridflow::transport_detail
