#include "hybridflow/runtime/worker_main.h"

#include <sys/prctl.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <thread>

#include "hybridflow/core/error.h"
#include "hybridflow/core/logging.h"
#include "hybridflow/core/printable.h"
#include "hybridflow/runtime/worker.h"
#include "launcher_detail.h"
#include "message.h"

namespace hybridflow {
namespace {

using runtime_detail::Message;

std::string env_or_fail(const char* name) {
  const char* v = std::getenv(name);
  HF_CHECK(v && *v, "worker process: environment variable ", name,
           " is not set (worker processes are started by the controller)");
  return v;
}

// Runs create/call requests one at a time on its own thread, so the I/O thread keeps answering and
// sending heartbeats while a long method runs.
class Executor {
 public:
  explicit Executor(runtime_detail::WakePipe& wake) : wake_(wake), thread_([this] { loop(); }) {}
  ~Executor() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void submit(Message m) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      inbox_.push_back(std::move(m));
    }
    cv_.notify_all();
  }
  std::deque<Message> take_replies() {
    std::lock_guard<std::mutex> lock(mutex_);
    return std::exchange(outbox_, {});
  }

 private:
  void loop() {
    while (true) {
      Message request;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [&] { return stop_ || !inbox_.empty(); });
        if (stop_) return;
        request = std::move(inbox_.front());
        inbox_.pop_front();
      }
      Message reply = handle(request);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        outbox_.push_back(std::move(reply));
      }
      wake_.notify();
    }
  }

  Message handle(const Message& request) {
    Message reply;
    reply.meta["call_id"] = request.meta.value("call_id", int64_t(-1));
    try {
      if (request.kind == "create") {
        WorkerContext ctx;
        ctx.role = request.meta.at("role");
        ctx.pool = request.meta.value("pool", "");
        ctx.coord = runtime_detail::coord_from_json(request.meta.at("coord"));
        ctx.config = request.meta.value("config", nlohmann::json::object());
        reply.meta["methods"] = host_.create(request.meta.at("type"), ctx);
        reply.kind = "created";
      } else if (request.kind == "call") {
        DataProto input = request.data ? *request.data : DataProto();
        reply.data = host_.call(request.meta.at("role"), request.meta.at("method"), input);
        reply.kind = "result";
      } else {
        HF_FAIL("worker process: unknown request kind '", request.kind, "'");
      }
    } catch (const std::exception& e) {
      reply.kind = "error";
      reply.meta["message"] = e.what();
    }
    return reply;
  }

  runtime_detail::WakePipe& wake_;
  WorkerHost host_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Message> inbox_, outbox_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace

int run_worker_main(int, char**) {
  const std::string endpoint = env_or_fail(runtime_detail::kEndpointEnv);
  const std::string token = env_or_fail(runtime_detail::kTokenEnv);
  const int rank = std::stoi(env_or_fail(runtime_detail::kRankEnv));
  // The thread name (top, /proc/PID/comm; 15 characters at most) says which pool and rank this is.
  const std::string pool = env_or_fail(runtime_detail::kPoolEnv);
  const std::string comm = "hf " + pool + " " + std::to_string(rank);
  ::prctl(PR_SET_NAME, comm.substr(0, 15).c_str());
  // Every message is authenticated with a key derived from the job secret, which never travels.
  runtime_detail::Link link(token, "pool:" + pool, rank);

  zmq::context_t context(1);
  zmq::socket_t socket(context, zmq::socket_type::dealer);
  socket.set(zmq::sockopt::linger, 0);
  // A random identity: kept across reconnects, and no stranger can take it before this worker connects.
  socket.set(zmq::sockopt::routing_id, "rank" + std::to_string(rank) + "-" + runtime_detail::random_secret().substr(0, 16));
  runtime_detail::Link::limit(socket);
  socket.connect(endpoint);

  Message hello;
  hello.kind = "hello";
  hello.meta = {{"rank", rank}, {"pid", static_cast<int64_t>(::getpid())}, {"host", runtime_detail::host_name()}};
  link.send(socket, "", runtime_detail::kControllerEnd, hello);

  runtime_detail::WakePipe wake;
  runtime_detail::RejectLog rejects("worker rank " + std::to_string(rank) + " of pool '" + printable(pool) + "'");
  int exit_code = 0;
  {
    Executor executor(wake);
    auto last_beat = std::chrono::steady_clock::now();
    // A worker nobody welcomes (controller gone or wrong endpoint) must not linger forever.
    const char* connect_env = std::getenv("HF_WORKER_CONNECT_TIMEOUT_S");
    const double connect_timeout_s = connect_env ? std::stod(connect_env) : 120.0;
    const auto started = last_beat;
    bool welcomed = false;
    bool running = true;
    // Workers the controller did not spawn cannot die with it: they watch for its heartbeats instead.
    double controller_silence_limit_s = 0;
    auto last_from_controller = started;
    while (running) {
      zmq::pollitem_t items[] = {{socket.handle(), 0, ZMQ_POLLIN, 0}, {nullptr, wake.fd(), ZMQ_POLLIN, 0}};
      zmq::poll(items, 2, std::chrono::milliseconds(static_cast<int>(runtime_detail::kHeartbeatPeriodS * 1000)));
      while (auto received = link.receive(socket, false)) {
        if (!received->message) {
          rejects.note(received->peer_address, received->reject_code,
                       "rejected a message from " + received->who() + ": " + received->rejected_reason);
          continue;
        }
        last_from_controller = std::chrono::steady_clock::now();
        if (received->message->kind == "shutdown") {
          exit_code = received->message->meta.value("exit_code", 0);
          running = false;
          break;
        }
        if (received->message->kind == "heartbeat") continue;
        if (received->message->kind == "welcome") {
          welcomed = true;
          controller_silence_limit_s = received->message->meta.value("heartbeat_timeout_s", 0.0);
          continue;
        }
        executor.submit(std::move(*received->message));
      }
      wake.drain();
      for (auto& reply : executor.take_replies()) link.send(socket, "", runtime_detail::kControllerEnd, reply);
      auto now = std::chrono::steady_clock::now();
      if (!welcomed && now - started > std::chrono::duration<double>(connect_timeout_s)) {
        std::fprintf(stderr, "hybridflow worker rank %d: no controller answered at %s within %.0f s "
                     "(HF_WORKER_CONNECT_TIMEOUT_S); exiting\n", rank, endpoint.c_str(), connect_timeout_s);
        exit_code = 1;
        running = false;
      }
      const double silent = std::chrono::duration<double>(now - last_from_controller).count();
      if (welcomed && controller_silence_limit_s > 0 && silent > controller_silence_limit_s) {
        std::fprintf(stderr, "hybridflow worker rank %d: no heartbeat from the controller at %s for %.1f s; "
                     "exiting\n", rank, endpoint.c_str(), silent);
        exit_code = 1;
        running = false;
      }
      if (now - last_beat >= std::chrono::duration<double>(runtime_detail::kHeartbeatPeriodS)) {
        link.send(socket, "", runtime_detail::kControllerEnd, Message{"heartbeat", {{"rank", rank}}, std::nullopt});
        last_beat = now;
      }
    }
    // A method still running would block the executor's join; the controller asked us to go, so go.
    std::fflush(nullptr);
    socket.close();
    context.close();
    ::_exit(exit_code);
  }
}

bool run_worker_if_requested() {
  int code = 1;
  try {
    if (std::getenv(runtime_detail::kEndpointEnv)) {
      code = run_worker_main(0, nullptr);
    } else {
      const LaunchSettings& launch = launch_settings();
      if (!launch.multi_rank()) return false;
      if (launch.is_controller()) {
        // Listen at once, so worker ranks are answered (and released at exit) even by a command that
        // never starts a pool.
        runtime_detail::launch_rendezvous();
        return false;
      }
      code = runtime_detail::run_launched_worker(launch);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hybridflow worker: %s\n", e.what());
  }
  std::fflush(nullptr);
  ::_exit(code);
}

}  // namespace hybridflow
