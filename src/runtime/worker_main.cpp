#include "hybridflow/runtime/worker_main.h"

#include <sys/prctl.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "hybridflow/core/error.h"
#include "hybridflow/core/logging.h"
#include "hybridflow/core/printable.h"
#include "hybridflow/transport/launcher.h"
#include "hybridflow/transport/net_address.h"
#include "hybridflow/runtime/worker.h"
#include "coord_json.h"
#include "rank_batch.h"
#include "transport/data_fetch.h"
#include "transport/data_server.h"
#include "transport/launcher_detail.h"
#include "transport/message.h"
#include "transport/object_table.h"

namespace hybridflow {
namespace {

using transport_detail::Message;

std::string env_or_fail(const char* name) {
  const char* v = std::getenv(name);
  HF_CHECK(v && *v, "worker process: environment variable ", name,
           " is not set (worker processes are started by the controller)");
  return v;
}

// Where this worker's data socket listens: its address on the route to the controller (loopback for a
// local run), so that every other worker of the job that reaches the controller reaches it too.
std::string data_socket_host(const std::string& endpoint) {
  const char* controller = std::getenv(kControllerAddrEnv);
  const std::string host = controller != nullptr && *controller != '\0' && std::string(controller) != "0.0.0.0"
                               ? std::string(controller)
                               : endpoint_host(endpoint);
  return local_address_towards(host);
}

// Runs create/call requests one at a time on its own thread, so the I/O thread keeps answering and
// sending heartbeats while a long method runs. Before a call it assembles the input its plan names (rows
// kept by workers, data_fetch.h); after it, it keeps the output's bulk tensors in the object table when the
// controller asked for that, answering with their description instead. Replies go to the rank's mailbox, or
// into the batch (rank_batch.h) the request came in.
class Executor {
 public:
  Executor(int rank, std::shared_ptr<runtime_detail::RankMailbox> mailbox, transport_detail::ObjectTable& table,
           transport_detail::InputFetcher& fetcher)
      : rank_(rank), mailbox_(std::move(mailbox)), table_(table), fetcher_(fetcher), thread_([this] { loop(); }) {}
  ~Executor() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  // From the rank's I/O thread, or from the thread of the rank leading a batch.
  void submit(runtime_detail::RankRequest request) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (auto& ready : order_.arrive(std::move(request))) inbox_.push_back(std::move(ready));
    }
    cv_.notify_one();  // the executor's thread is the only one waiting
  }

 private:
  void loop() {
    while (true) {
      runtime_detail::RankRequest request;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [&] { return stop_ || !inbox_.empty(); });
        if (stop_) return;
        request = std::move(inbox_.front());
        inbox_.pop_front();
      }
      Message reply = handle(request);
      if (request.batch)
        request.batch->finish(request.slot, std::move(reply), *mailbox_);
      else
        mailbox_->post(std::move(reply));
    }
  }

  // The request's message may be shared with the other ranks of a batch: read, never written.
  Message handle(runtime_detail::RankRequest& queued) {
    const Message& request = *queued.message;
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
        DataProto input = queued.data ? std::move(*queued.data) : DataProto();
        transport_detail::InputFetcher::Result fetched;
        if (request.meta.contains("plan")) input = fetcher_.assemble(std::move(input), request.meta.at("plan"), &fetched);
        DataProto output = host_.call(request.meta.at("role"), request.meta.at("method"), input);
        // Inputs handed over without a copy are shared with every other reader of those rows.
        for (const auto& [object, key] : fetched.shared) table_.get(object, key);
        if (request.meta.contains("keep"))
          keep(request.meta.at("call_id").get<int64_t>(), request.meta.at("keep"), output, reply.meta);
        if (fetched.fetched_bytes > 0) reply.meta["fetched_bytes"] = fetched.fetched_bytes;
        reply.data = std::move(output);
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

  // Keeps the tensors of `output` with more than inline_row_bytes per row as object `id`, leaving the rest
  // (small per-row tensors, fields, meta) to travel with the answer; `kept` in the answer describes them.
  // An output that does not fit the table travels whole, as without the data plane.
  void keep(int64_t id, const nlohmann::json& options, DataProto& output, nlohmann::json& reply_meta) {
    if (output.batch_size() == 0) return;
    const int64_t inline_row_bytes = options.value("inline_row_bytes", int64_t{0});
    std::map<std::string, torch::Tensor> kept;
    nlohmann::json described = nlohmann::json::array();
    for (const auto& [key, t] : output.tensors()) {
      const int64_t row_bytes = t.numel() / output.batch_size() * static_cast<int64_t>(t.element_size());
      if (row_bytes <= inline_row_bytes) continue;
      kept[key] = t.detach().to(torch::kCPU).contiguous();  // the bytes the answer would have carried
      described.push_back({{"key", key}, {"dtype", dtype_name(t.scalar_type())}, {"shape", t.sizes().vec()}});
    }
    if (kept.empty()) return;
    std::vector<std::string> keys;
    for (const auto& kv : kept) keys.push_back(kv.first);
    if (!table_.put(id, std::move(kept))) {
      if (!warned_full_)
        log_warn("data plane: the object table of this worker is full (", table_.bytes(), " bytes held; ",
                 "ResourcePool::object_table_bytes); outputs travel to the controller until objects are released");
      warned_full_ = true;
      return;
    }
    for (const auto& key : keys) output.erase_tensor(key);
    reply_meta["kept"] = {{"object", id}, {"tensors", described}};
  }

  int rank_;
  std::shared_ptr<runtime_detail::RankMailbox> mailbox_;
  transport_detail::ObjectTable& table_;
  transport_detail::InputFetcher& fetcher_;
  bool warned_full_ = false;
  WorkerHost host_;
  std::mutex mutex_;
  std::condition_variable cv_;
  runtime_detail::CallOrder order_;
  std::deque<runtime_detail::RankRequest> inbox_;
  bool stop_ = false;
  std::thread thread_;
};

// One worker rank: its connection, its key state, its executor and data socket. In a process of its own
// (own_process) it ends the process when told to shut down; a simulated rank returns the exit code instead.
int serve_worker_rank(zmq::context_t& context, const std::string& endpoint, const std::string& token, int rank,
                      const std::string& pool, bool own_process) {
  // The thread name (top, /proc/PID/comm; 15 characters at most) says which pool and rank this is.
  const std::string comm = "hf " + pool + " " + std::to_string(rank);
  ::prctl(PR_SET_NAME, comm.substr(0, 15).c_str());
  // Every message is authenticated with a key derived from the job secret, which never travels.
  transport_detail::Link link(token, "pool:" + pool, rank);

  zmq::socket_t socket(context, zmq::socket_type::dealer);
  socket.set(zmq::sockopt::linger, 0);
  // A random identity: kept across reconnects, and no stranger can take it before this worker connects.
  socket.set(zmq::sockopt::routing_id, "rank" + std::to_string(rank) + "-" + transport_detail::random_secret().substr(0, 16));
  transport_detail::Link::limit(socket);
  socket.connect(endpoint);

  // The data plane: outputs kept here, served from a socket of their own (data_server.h). Without one
  // (no route to bind on) the worker still runs; its pool then sends outputs to the controller.
  const std::string where = "worker rank " + std::to_string(rank) + " of pool '" + printable(pool) + "'";
  const char* data_token = std::getenv(transport_detail::kDataTokenEnv);
  const std::string data_secret = data_token != nullptr && *data_token != '\0' ? data_token : token;
  transport_detail::ObjectTable table;
  transport_detail::InputFetcher fetcher(context, table);
  std::unique_ptr<transport_detail::DataServer> data_server;
  try {
    data_server = std::make_unique<transport_detail::DataServer>(context, data_socket_host(endpoint), table,
                                                               where + ", data socket");
  } catch (const std::exception& e) {
    log_warn(where, ": no data socket (", e.what(), "); its outputs will travel through the controller");
  }

  Message hello;
  hello.kind = "hello";
  hello.meta = {{"rank", rank}, {"pid", static_cast<int64_t>(::getpid())}, {"host", transport_detail::host_name()}};
  if (data_server) hello.meta["data_endpoint"] = data_server->endpoint();
  hello.meta["machine"] = transport_detail::shared_rows_machine();  // on the controller's: calls by shared memory
  hello.meta["batches"] = true;  // takes batched requests for the ranks of its process (rank_batch.h)

  auto mailbox = std::make_shared<runtime_detail::RankMailbox>();
  transport_detail::RejectLog rejects(where);
  int exit_code = 0;
  {
    Executor executor(rank, mailbox, table, fetcher);
    // Reachable by the process's other ranks (batches they lead) from before the controller hears of it.
    struct Listed {
      int rank;
      ~Listed() { runtime_detail::RankDirectory::process().remove(rank); }
    } listed{rank};
    runtime_detail::RankDirectory::process().add(
        rank, [&executor](runtime_detail::RankRequest request) { executor.submit(std::move(request)); });
    link.send(socket, "", transport_detail::kControllerEnd, hello);
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
      zmq::pollitem_t items[] = {{socket.handle(), 0, ZMQ_POLLIN, 0},
                                 {nullptr, mailbox->wake_fd(), ZMQ_POLLIN, 0},
                                 {data_server ? data_server->socket().handle() : nullptr, 0, ZMQ_POLLIN, 0}};
      zmq::poll(items, data_server ? 3 : 2,
                std::chrono::milliseconds(static_cast<int>(transport_detail::kHeartbeatPeriodS * 1000)));
      if (data_server) data_server->serve();
      while (auto received = link.receive(socket, false)) {
        if (!received->message) {
          rejects.note(received->peer_address, received->reject_code,
                       "rejected a message from " + received->who() + ": " + received->rejected_reason);
          continue;
        }
        last_from_controller = std::chrono::steady_clock::now();
        runtime_detail::RankDirectory::process().heard_from_controller(last_from_controller);
        if (received->message->kind == "shutdown") {
          exit_code = received->message->meta.value("exit_code", 0);
          running = false;
          break;
        }
        if (received->message->kind == "heartbeat") continue;
        if (received->message->kind == "welcome") {
          const auto& meta = received->message->meta;
          welcomed = true;
          controller_silence_limit_s = meta.value("heartbeat_timeout_s", 0.0);
          if (meta.contains("node")) {
            table.set_capacity(meta.value("object_table_bytes", int64_t{0}));
            fetcher.start(data_secret, meta.at("node").get<int>());
            if (data_server) data_server->start(data_secret, meta.at("node").get<int>());
          }
          continue;
        }
        // Rows of kept outputs for the controller, and releases: answered here, even while a method runs.
        if (received->message->kind == "fetch") {
          const auto& meta = received->message->meta;
          Message reply{"rows", {{"call_id", meta.value("call_id", int64_t(-1))}}, std::nullopt};
          try {
            transport_detail::RowRuns runs;
            for (const auto& r : meta.at("runs")) runs.emplace_back(r.at(0).get<int64_t>(), r.at(1).get<int64_t>());
            reply.data = table.rows(meta.at("object").get<int64_t>(), meta.at("keys").get<std::vector<std::string>>(), runs);
          } catch (const std::exception& e) {
            reply.kind = "error";
            reply.meta["message"] = e.what();
          }
          link.send(socket, "", transport_detail::kControllerEnd, reply);
          continue;
        }
        if (received->message->kind == "release") {
          for (const auto& id : received->message->meta.value("objects", nlohmann::json::array()))
            table.release(id.get<int64_t>());
          continue;
        }
        if (received->message->meta.contains("ranks"))
          runtime_detail::dispatch_rank_batch(std::move(*received->message), mailbox);
        else
          executor.submit(runtime_detail::RankRequest::alone(std::move(*received->message)));
      }
      mailbox->drain_wake();
      for (auto& reply : mailbox->take()) link.send(socket, "", transport_detail::kControllerEnd, reply);
      auto now = std::chrono::steady_clock::now();
      if (!welcomed && now - started > std::chrono::duration<double>(connect_timeout_s)) {
        std::fprintf(stderr, "hybridflow worker rank %d: no controller answered at %s within %.0f s "
                     "(HF_WORKER_CONNECT_TIMEOUT_S); exiting\n", rank, endpoint.c_str(), connect_timeout_s);
        exit_code = 1;
        running = false;
      }
      // The controller's heartbeats reach one rank of a process that shares it (rank_batch.h).
      const auto heard = std::max(last_from_controller, runtime_detail::RankDirectory::process().last_heard_from_controller());
      const double silent = std::chrono::duration<double>(now - heard).count();
      if (welcomed && controller_silence_limit_s > 0 && silent > controller_silence_limit_s) {
        std::fprintf(stderr, "hybridflow worker rank %d: no heartbeat from the controller at %s for %.1f s; "
                     "exiting\n", rank, endpoint.c_str(), silent);
        exit_code = 1;
        running = false;
      }
      if (now - last_beat >= std::chrono::duration<double>(transport_detail::kHeartbeatPeriodS)) {
        // With what the data plane holds here, for ProcessPool::held_objects(). One rank of the process
        // sends it, for all of its ranks alive (rank_batch.h).
        nlohmann::json figures = {{"rank", rank}, {"objects", table.objects()}, {"object_bytes", table.bytes()},
                                  {"data_rejected", data_server ? data_server->rejected() : size_t{0}}};
        // A rank joins its process's heartbeat once welcomed: the controller knows it by then.
        std::optional<nlohmann::json> others = nlohmann::json::array();
        if (welcomed) others = runtime_detail::RankDirectory::process().beat(rank, figures, now);
        if (others) {
          Message beat{"heartbeat", std::move(figures), std::nullopt};
          if (!others->empty()) beat.meta["also"] = std::move(*others);
          link.send(socket, "", transport_detail::kControllerEnd, beat);
        }
        last_beat = now;
      }
    }
    // A method still running would block the executor's join; the controller asked us to go, so go.
    // The context is not terminated: that waits for every socket, and the executor's data sockets may be
    // in a fetch; _exit reclaims them all.
    std::fflush(nullptr);
    data_server.reset();
    socket.close();
    if (own_process) ::_exit(exit_code);
  }
  return exit_code;
}

}  // namespace

int run_worker_main(int, char**) {
  const std::string endpoint = env_or_fail(transport_detail::kEndpointEnv);
  const std::string token = env_or_fail(transport_detail::kTokenEnv);
  const int rank = std::stoi(env_or_fail(transport_detail::kRankEnv));
  const std::string pool = env_or_fail(transport_detail::kPoolEnv);
  const char* count_text = std::getenv(kWorkerRankCountEnv);
  if (count_text == nullptr || *count_text == '\0') {
    zmq::context_t context(1);
    return serve_worker_rank(context, endpoint, token, rank, pool, /*own_process=*/true);
  }
  char* end = nullptr;
  const long count = std::strtol(count_text, &end, 10);
  HF_CHECK(end != count_text && *end == '\0' && count >= 1 && count <= 65535, "worker process: ",
           kWorkerRankCountEnv, "=", count_text, " must be a number of ranks from 1 to 65535");
  // Never destroyed: terminating it waits for every socket, and the process ends right after its ranks.
  auto* context = new zmq::context_t(2);
  context->set(zmq::ctxopt::max_sockets, 4 * static_cast<int>(count) + 64);  // a rank holds up to 4 sockets
  std::vector<int> codes(static_cast<size_t>(count), 0);
  std::vector<std::thread> ranks;
  for (long i = 0; i < count; ++i)
    ranks.emplace_back([&, i] {
      try {
        codes[static_cast<size_t>(i)] =
            serve_worker_rank(*context, endpoint, token, rank + static_cast<int>(i), pool, /*own_process=*/false);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "hybridflow worker rank %ld: %s\n", rank + i, e.what());
        codes[static_cast<size_t>(i)] = 1;
      }
    });
  for (auto& t : ranks) t.join();
  return *std::max_element(codes.begin(), codes.end());
}

bool run_worker_if_requested() {
  int code = 1;
  try {
    if (std::getenv(transport_detail::kEndpointEnv)) {
      code = run_worker_main(0, nullptr);
    } else {
      const LaunchSettings& launch = launch_settings();
      if (!launch.multi_rank()) return false;
      if (launch.is_controller()) {
        // Listen at once, so worker ranks are answered (and released at exit) even by a command that
        // never starts a pool.
        transport_detail::launch_rendezvous();
        return false;
      }
      const auto released = transport_detail::run_launched_worker(launch);
      code = released ? *released : run_worker_main(0, nullptr);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hybridflow worker: %s\n", e.what());
  }
  std::fflush(nullptr);
  ::_exit(code);
}

}  // namespace hybridflow
