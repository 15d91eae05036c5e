#include "hybridflow/runtime/process_pool.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <mutex>
#include <thread>

#include "hybridflow/core/error.h"
#include "hybridflow/core/logging.h"
#include "hybridflow/core/printable.h"
#include "launcher_detail.h"
#include "message.h"

extern char** environ;

namespace hybridflow {
namespace {

using Clock = std::chrono::steady_clock;
using runtime_detail::Message;

// Process groups of live pools, read by the signal handler (which may only use async-signal-safe calls).
constexpr int kMaxPools = 64;
std::atomic<int> g_pool_pgids[kMaxPools];

void kill_pools_and_reraise(int sig) {
  for (auto& slot : g_pool_pgids) {
    int pgid = slot.load();
    if (pgid > 0) ::kill(-pgid, SIGKILL);
  }
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

std::atomic<bool> g_graceful_stop{false};
std::atomic<int> g_stop_signal{0};

void on_signal(int sig) {
  int none = 0;
  if (g_graceful_stop.load() && (sig == SIGINT || sig == SIGTERM) && g_stop_signal.compare_exchange_strong(none, sig)) {
    static const char kMessage[] = "\n[hybridflow] stopping after the current step; signal again to stop at once\n";
    ssize_t ignored = ::write(2, kMessage, sizeof(kMessage) - 1);
    (void)ignored;
    return;
  }
  kill_pools_and_reraise(sig);
}

void install_signal_handlers() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa;
    std::memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) ::sigaction(sig, &sa, nullptr);
  });
}

void register_pgid(int pgid) {
  for (auto& slot : g_pool_pgids) {
    int expected = 0;
    if (slot.compare_exchange_strong(expected, pgid)) return;
  }
  log_warn("more than ", kMaxPools, " resource pools: Ctrl-C cleanup covers only the first ", kMaxPools);
}

void unregister_pgid(int pgid) {
  for (auto& slot : g_pool_pgids) {
    int expected = pgid;
    if (slot.compare_exchange_strong(expected, 0)) return;
  }
}

std::string describe_exit(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("was killed by signal ") + std::to_string(WTERMSIG(status)) + " (" +
                                  ::strsignal(WTERMSIG(status)) + ")";
  return "stopped with status " + std::to_string(status);
}

// Pools of this process, numbered: a worker's node on the data plane is pool index << 16 | rank.
std::atomic<int> g_next_pool_index{1};
constexpr int kMaxPoolRanks = 1 << 16;

struct RankState {
  int pid = -1;
  std::string host = "?";
  std::string identity;
  std::string data_endpoint;  // its data socket, from its hello (empty: none)
  int64_t objects = 0, object_bytes = 0;  // what it keeps, from its last heartbeat
  size_t data_rejected = 0;
  bool connected = false;
  bool alive = true;  // not reaped yet
  Clock::time_point last_seen;
};

struct Pending {
  std::string role, method;
  std::vector<bool> addressed;  // the ranks asked (a fetch asks one)
  std::vector<std::optional<Message>> replies;
  int remaining = 0;
  Clock::time_point deadline;
  std::function<void(std::vector<Message>&&)> on_done;
  std::function<void(std::exception_ptr)> on_error;
};

}  // namespace

struct ProcessPool::Impl {
  ResourcePool spec;
  std::string token;  // the job secret: only its derived key is used on the wire
  std::string endpoint;
  std::unique_ptr<runtime_detail::Link> link;  // I/O thread only
  std::unique_ptr<runtime_detail::RejectLog> reject_log;
  zmq::context_t context{1};
  zmq::socket_t router{context, zmq::socket_type::router};
  runtime_detail::WakePipe wake;

  mutable std::mutex mutex;
  std::condition_variable cv;
  std::vector<RankState> ranks;
  std::vector<int> launch_ranks;  // launcher rank serving each pool rank; empty unless launched
  Clock::time_point last_heartbeat;
  int pgid = 0;
  bool spawned = false;
  std::deque<std::pair<int, Message>> outbox;
  std::map<int64_t, Pending> pending;
  int64_t next_id = 1;
  std::string failure;
  bool failure_handled = false;  // workers killed and reaped, pending calls failed
  bool stopping = false;
  bool exiting = false;
  Clock::time_point exit_deadline;
  std::atomic<size_t> rejected{0};
  int pool_index = 0;
  std::string data_token;  // the data plane's secret (never sent): ResourcePool::data_token or token
  std::atomic<uint64_t> sent_tensor_bytes{0}, received_tensor_bytes{0}, message_bytes{0}, worker_bytes{0};
  std::mutex release_mutex;       // taken after `mutex`, never before it
  std::vector<int64_t> releases;  // objects to release on every rank (sent by the I/O thread)

  // Helper threads of chained calls; finished ones are joined on the next when_ready so a long run
  // does not accumulate threads.
  struct Waiter {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::mutex waiters_mutex;
  std::vector<Waiter> waiters;
  std::thread io;
  std::once_flag shutdown_once;

  std::string where(int rank) const {
    const auto& r = ranks[rank];
    if (!launch_ranks.empty())
      return detail::concat("rank ", rank, " (launcher rank ", launch_ranks[rank], ", pid ", r.pid, " on host ", r.host, ")");
    return detail::concat("rank ", rank, " (pid ", r.pid, " on host ", r.host, ")");
  }

  // What `rank` was busy with, for failure messages.
  std::string running_on(int rank) const {
    std::string out;
    for (const auto& kv : pending)
      if (kv.second.addressed[rank] && !kv.second.replies[rank])
        out += (out.empty() ? "" : ", ") + kv.second.role + "." + kv.second.method;
    return out.empty() ? "while idle" : "while running method " + out;
  }

  void spawn() {
    const std::string exe = spec.executable.empty() ? "/proc/self/exe" : spec.executable;
    std::vector<std::string> base_env;
    for (char** e = environ; *e; ++e) {
      std::string kv = *e;
      std::string key = kv.substr(0, kv.find('='));
      if (key.rfind("HF_WORKER_", 0) != 0 && key != kControllerAddrEnv && key != "LOCAL_RANK" && !spec.env.count(key))
        base_env.push_back(kv);
    }
    for (const auto& kv : spec.env) base_env.push_back(kv.first + "=" + kv.second);
    const pid_t parent = ::getpid();
    // argv[0] is what `ps` shows: "hybridflow worker <pool> rank <r>", so a user can tell the processes apart.
    std::string program = "hybridflow";
    try {
      program = std::filesystem::canonical(exe).filename().string();
    } catch (const std::exception&) {
    }
    for (int rank = 0; rank < spec.num_processes; ++rank) {
      // Everything the child needs is built before fork: after fork only async-signal-safe calls.
      std::vector<std::string> env = base_env;
      env.push_back(std::string(runtime_detail::kEndpointEnv) + "=" + endpoint);
      env.push_back(std::string(runtime_detail::kTokenEnv) + "=" + token);
      env.push_back(std::string(runtime_detail::kDataTokenEnv) + "=" + data_token);
      env.push_back(std::string(runtime_detail::kRankEnv) + "=" + std::to_string(rank));
      env.push_back(std::string(runtime_detail::kPoolEnv) + "=" + spec.name);
      env.push_back(std::string(kControllerAddrEnv) + "=" + spec.bind_host);
      if (!spec.env.count("LOCAL_RANK")) env.push_back("LOCAL_RANK=" + std::to_string(spec.local_rank_offset + rank));
      std::vector<char*> envp, argv;
      for (auto& s : env) envp.push_back(s.data());
      envp.push_back(nullptr);
      std::string arg0 = program + " worker " + spec.name + " rank " + std::to_string(rank);
      std::vector<std::string> args = spec.args;
      argv.push_back(arg0.data());
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      const int group = pgid;
      pid_t pid = ::fork();
      if (pid < 0) HF_FAIL("resource pool '", spec.name, "': fork failed: ", std::strerror(errno));
      if (pid == 0) {
        ::setpgid(0, group);
        ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // die with the controller's I/O thread, whatever happens
        if (::getppid() != parent) ::_exit(1);
        ::execve(exe.c_str(), argv.data(), envp.data());
        ::_exit(127);
      }
      ::setpgid(pid, group == 0 ? pid : group);  // also in the parent: no race with the first kill
      std::lock_guard<std::mutex> lock(mutex);
      if (pgid == 0) {
        pgid = pid;
        register_pgid(pgid);
      }
      ranks[rank].pid = pid;
      ranks[rank].last_seen = Clock::now();
    }
  }

  void kill_and_reap_all() {
    if (!spec.spawn_workers) return;  // not our children (maybe not even on this host)
    std::vector<int> pids;
    int group;
    {
      std::lock_guard<std::mutex> lock(mutex);
      group = pgid;
      for (auto& r : ranks)
        if (r.alive && r.pid > 0) pids.push_back(r.pid);
    }
    if (group > 0) ::kill(-group, SIGKILL);
    for (int pid : pids) ::kill(pid, SIGKILL);
    for (int pid : pids) {
      int status = 0;
      while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
    }
    std::lock_guard<std::mutex> lock(mutex);
    for (auto& r : ranks) r.alive = false;
  }

  // Marks the pool failed, kills every worker and fails every pending call with `message`.
  void fail(const std::string& message) {
    std::map<int64_t, Pending> failed;
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (!failure.empty()) return;
      failure = message;
      failed.swap(pending);
    }
    log_error(message);
    kill_and_reap_all();
    {
      std::lock_guard<std::mutex> lock(mutex);
      failure_handled = true;
    }
    cv.notify_all();
    for (auto& kv : failed) kv.second.on_error(std::make_exception_ptr(Error(message)));
  }

  void handle(runtime_detail::Received& received, std::vector<std::function<void()>>& callbacks) {
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

  // Drops a message that must not reach the run: counted, logged once per peer and kind of rejection.
  void reject(const runtime_detail::Received& received, const std::string& code, const std::string& why) {
    ++rejected;
    // Per connection: a stranger opening many connections is capped by RejectLog::kMaxKeys.
    reject_log->note(received.identity, code, "rejected a message from " + received.who() + ": " + why);
  }

  // Dead children, overdue calls, silent workers. Returns the failure to raise, empty if healthy.
  std::string check_health() {
    std::lock_guard<std::mutex> lock(mutex);
    const auto now = Clock::now();
    for (size_t r = 0; r < ranks.size(); ++r) {
      auto& rank = ranks[r];
      if (!spec.spawn_workers || !rank.alive || rank.pid <= 0) continue;
      int status = 0;
      if (::waitpid(rank.pid, &status, WNOHANG) == rank.pid) {
        rank.alive = false;
        if (exiting) continue;
        return detail::concat("resource pool '", spec.name, "': worker ", where(r), " ", describe_exit(status), " ",
                              running_on(static_cast<int>(r)));
      }
    }
    if (exiting) return "";
    for (const auto& kv : pending) {
      if (now < kv.second.deadline) continue;
      std::string ranks_left;
      for (size_t r = 0; r < ranks.size(); ++r)
        if (kv.second.addressed[r] && !kv.second.replies[r])
          ranks_left += (ranks_left.empty() ? "" : ", ") + where(static_cast<int>(r));
      return detail::concat("resource pool '", spec.name, "': call '", kv.second.role, ".", kv.second.method,
                            "' timed out after ", spec.call_timeout_s, " s (call_timeout_s); still running on ",
                            ranks_left);
    }
    for (size_t r = 0; r < ranks.size(); ++r) {
      const auto& rank = ranks[r];
      if (!rank.connected) continue;
      double silent = std::chrono::duration<double>(now - rank.last_seen).count();
      if (silent > spec.heartbeat_timeout_s)
        return detail::concat("resource pool '", spec.name, "': no heartbeat from worker ", where(static_cast<int>(r)),
                              " for ", silent, " s ", running_on(static_cast<int>(r)));
    }
    return "";
  }

  void loop() {
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
        if (!spec.spawn_workers && now - last_heartbeat >= std::chrono::duration<double>(runtime_detail::kHeartbeatPeriodS)) {
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

  int node_of(int rank) const { return (pool_index << 16) | rank; }

  // Registers a request to the ranks that have a message (messages[i] goes to rank i); on_done gets the
  // replies indexed by rank, empty for ranks not asked.
  void request(const std::string& kind, const std::string& role, const std::string& method,
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
          messages[r]->kind = kind;
          messages[r]->meta["call_id"] = id;
          outbox.emplace_back(static_cast<int>(r), std::move(*messages[r]));
        }
        wake.notify();
        return;
      }
    }
    on_error(std::make_exception_ptr(
        Error(detail::concat("resource pool '", spec.name, "' cannot run '", role, ".", method, "': ", why))));
  }
};

ProcessPool::ProcessPool(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

std::shared_ptr<ProcessPool> ProcessPool::start(const ResourcePool& requested) {
  HF_CHECK(requested.num_processes > 0, "resource pool '", requested.name, "': num_processes must be positive, got ",
           requested.num_processes);
  // In a multi-rank launch the launcher already started the workers: the pool claims some of them.
  runtime_detail::Rendezvous* launch = requested.spawn_workers ? runtime_detail::launch_rendezvous() : nullptr;
  runtime_detail::Rendezvous::Claim claim;
  if (launch) claim = launch->claim(requested);
  const ResourcePool& spec = launch ? claim.spec : requested;
  HF_CHECK(spec.call_timeout_s > 0 && spec.heartbeat_timeout_s > 0 && spec.start_timeout_s > 0,
           "resource pool '", spec.name, "': timeouts must be positive");
  install_signal_handlers();
  HF_CHECK(spec.num_processes < kMaxPoolRanks, "resource pool '", spec.name, "': at most ", kMaxPoolRanks - 1,
           " processes, got ", spec.num_processes);
  HF_CHECK(spec.inline_row_bytes >= 0 && spec.object_table_bytes >= 0 && spec.data_fetch_timeout_s > 0,
           "resource pool '", spec.name, "': inline_row_bytes and object_table_bytes must be >= 0 and ",
           "data_fetch_timeout_s positive");
  auto impl = std::make_shared<Impl>();
  impl->spec = spec;
  if (!spec.token.empty()) check_job_secret(spec.token, "resource pool '" + spec.name + "': token");
  if (!spec.data_token.empty()) check_job_secret(spec.data_token, "resource pool '" + spec.name + "': data_token");
  impl->token = spec.token.empty() ? runtime_detail::random_secret() : spec.token;
  impl->data_token = spec.data_token.empty() ? impl->token : spec.data_token;
  impl->pool_index = g_next_pool_index++;
  HF_CHECK(impl->pool_index < (1 << 15), "more than 32767 resource pools in one controller process");
  impl->link = std::make_unique<runtime_detail::Link>(impl->token, "pool:" + spec.name, runtime_detail::kControllerEnd);
  impl->reject_log = std::make_unique<runtime_detail::RejectLog>("resource pool '" + spec.name + "'");
  impl->ranks.resize(spec.num_processes);
  impl->router.set(zmq::sockopt::linger, 0);
  runtime_detail::Link::limit(impl->router);
  const std::string listen = "tcp://" + spec.bind_host + ":" + (spec.bind_port > 0 ? std::to_string(spec.bind_port) : "*");
  try {
    impl->router.bind(listen);
  } catch (const zmq::error_t& e) {
    HF_FAIL("resource pool '", spec.name, "': cannot listen on ", listen, " (bind_host/bind_port): ", e.what());
  }
  impl->endpoint = impl->router.get(zmq::sockopt::last_endpoint);
  if (launch) {
    impl->launch_ranks = claim.ranks;
    launch->hand_out(spec, claim.ranks, std::stoi(impl->endpoint.substr(impl->endpoint.rfind(':') + 1)));
  }
  std::shared_ptr<ProcessPool> pool(new ProcessPool(impl));
  impl->io = std::thread([raw = impl.get()] { raw->loop(); });

  std::unique_lock<std::mutex> lock(impl->mutex);
  bool ok = impl->cv.wait_for(lock, std::chrono::duration<double>(spec.start_timeout_s), [&] {
    if (!impl->failure.empty()) return true;
    if (!impl->spawned) return false;
    for (auto& r : impl->ranks)
      if (!r.connected) return false;
    return true;
  });
  std::string failure = impl->failure;
  std::string missing;
  for (size_t r = 0; r < impl->ranks.size(); ++r)
    if (!impl->ranks[r].connected)
      missing += (missing.empty() ? "" : ", ") + std::to_string(r) +
                 (launch ? " (launcher rank " + std::to_string(claim.ranks[r]) + ")" : "");
  lock.unlock();
  if (failure.empty() && !ok) {
    failure = detail::concat("resource pool '", spec.name, "': worker ranks ", missing, " did not connect to ",
                             impl->endpoint, " within start_timeout_s = ", spec.start_timeout_s, " s ",
                             launch ? "(did every launcher rank start, with the same HF_JOB_TOKEN, and can it reach "
                                      "this address?)"
                                    : "(is the worker binary calling run_worker_if_requested()?)");
    impl->fail(failure);
  }
  if (!failure.empty()) {
    pool->shutdown();
    HF_FAIL(failure);
  }
  log_debug("resource pool '", spec.name, "': ", spec.num_processes, " workers connected on ", impl->endpoint);
  return pool;
}

ProcessPool::~ProcessPool() { shutdown(); }

const ResourcePool& ProcessPool::spec() const { return impl_->spec; }
int ProcessPool::size() const { return impl_->spec.num_processes; }
std::string ProcessPool::endpoint() const { return impl_->endpoint; }
std::string ProcessPool::token() const { return impl_->token; }
size_t ProcessPool::rejected_messages() const { return impl_->rejected.load(); }

std::vector<int> ProcessPool::pids() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  std::vector<int> out;
  for (auto& r : impl_->ranks) out.push_back(r.pid);
  return out;
}

bool ProcessPool::failed() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->failure_handled;
}

std::string ProcessPool::failure() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->failure_handled ? impl_->failure : std::string();
}

std::map<std::string, std::string> ProcessPool::create_role(const std::string& role, const std::string& worker_type,
                                                            const std::vector<MeshCoord>& coords,
                                                            const nlohmann::json& config) {
  HF_CHECK(static_cast<int>(coords.size()) == size(), "worker group '", role, "': ", coords.size(),
           " mesh coordinates for resource pool '", spec().name, "' of ", size(), " processes");
  std::vector<std::optional<Message>> messages(coords.size());
  for (size_t r = 0; r < coords.size(); ++r)
    messages[r] = Message{"", {{"role", role}, {"type", worker_type}, {"pool", spec().name},
                               {"coord", runtime_detail::coord_to_json(coords[r])}, {"config", config}},
                          std::nullopt};
  auto done = std::make_shared<std::promise<std::map<std::string, std::string>>>();
  auto result = done->get_future();
  impl_->request(
      "create", role, "<create " + worker_type + ">", std::move(messages),
      [done](std::vector<Message>&& replies) {
        done->set_value(replies.at(0).meta.at("methods").get<std::map<std::string, std::string>>());
      },
      [done](std::exception_ptr e) { done->set_exception(e); });
  return result.get();
}

void ProcessPool::submit(const std::string& role, const std::string& method, std::vector<DataProto> inputs,
                         std::function<void(std::vector<DataProto>&&)> on_done,
                         std::function<void(std::exception_ptr)> on_error) {
  std::vector<RankInput> planless;
  for (auto& input : inputs) planless.push_back({std::move(input), nullptr});
  submit(
      role, method, std::move(planless), /*keep_outputs=*/false,
      [on_done](std::vector<RankOutput>&& outputs) {
        std::vector<DataProto> data;
        for (auto& o : outputs) data.push_back(std::move(o.data));
        on_done(std::move(data));
      },
      std::move(on_error));
}

void ProcessPool::submit(const std::string& role, const std::string& method, std::vector<RankInput> inputs,
                         bool keep_outputs, std::function<void(std::vector<RankOutput>&&)> on_done,
                         std::function<void(std::exception_ptr)> on_error) {
  HF_CHECK(static_cast<int>(inputs.size()) == size(), "submit '", role, ".", method, "': ", inputs.size(),
           " inputs for ", size(), " ranks");
  std::vector<std::optional<Message>> messages(inputs.size());
  for (size_t r = 0; r < inputs.size(); ++r) {
    Message m{"", {{"role", role}, {"method", method}}, std::move(inputs[r].data)};
    if (!inputs[r].plan.is_null()) m.meta["plan"] = std::move(inputs[r].plan);
    if (keep_outputs) m.meta["keep"] = {{"inline_row_bytes", impl_->spec.inline_row_bytes}};
    messages[r] = std::move(m);
  }
  impl_->request(
      "call", role, method, std::move(messages),
      [on_done](std::vector<Message>&& replies) {
        std::vector<RankOutput> outputs;
        for (auto& m : replies)
          outputs.push_back({m.data ? std::move(*m.data) : DataProto(), m.meta.value("kept", nlohmann::json())});
        on_done(std::move(outputs));
      },
      std::move(on_error));
}

void ProcessPool::fetch(int rank, int64_t object, const std::vector<std::string>& keys,
                        const std::vector<std::pair<int64_t, int64_t>>& runs, const std::string& role,
                        const std::string& method, std::function<void(DataProto&&)> on_done,
                        std::function<void(std::exception_ptr)> on_error) {
  HF_CHECK(rank >= 0 && rank < size(), "fetch from rank ", rank, " of resource pool '", spec().name, "' of ", size());
  nlohmann::json run_list = nlohmann::json::array();
  for (const auto& [start, count] : runs) run_list.push_back({start, count});
  std::vector<std::optional<Message>> messages(static_cast<size_t>(size()));
  messages[static_cast<size_t>(rank)] =
      Message{"", {{"object", object}, {"keys", keys}, {"runs", run_list}}, std::nullopt};
  impl_->request(
      "fetch", role, method + " (fetching its kept output)", std::move(messages),
      [on_done, rank](std::vector<Message>&& replies) {
        on_done(replies[static_cast<size_t>(rank)].data ? std::move(*replies[static_cast<size_t>(rank)].data)
                                                       : DataProto());
      },
      std::move(on_error));
}

void ProcessPool::release(int64_t object) {
  // Its own lock: a handle may go while the pool's mutex is held (a failed call's callbacks dropped).
  {
    std::lock_guard<std::mutex> lock(impl_->release_mutex);
    impl_->releases.push_back(object);
  }
  impl_->wake.notify();
}

ProcessPool::RankInfo ProcessPool::rank_info(int rank) const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  const RankState& r = impl_->ranks.at(static_cast<size_t>(rank));
  return {r.pid, r.host, r.data_endpoint, impl_->node_of(rank)};
}

bool ProcessPool::keeps_outputs() const {
  if (!impl_->spec.data_plane) return false;
  std::lock_guard<std::mutex> lock(impl_->mutex);
  for (const auto& r : impl_->ranks)
    if (r.data_endpoint.empty()) return false;
  return true;
}

bool ProcessPool::shares_data_key(const ProcessPool& other) const { return impl_->data_token == other.impl_->data_token; }

ProcessPool::HeldObjects ProcessPool::held_objects() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  HeldObjects out;
  for (const auto& r : impl_->ranks) {
    out.objects += r.objects;
    out.bytes += r.object_bytes;
    out.rejected_requests += r.data_rejected;
  }
  return out;
}

Traffic ProcessPool::traffic() const {
  Traffic t;
  t.controller_sent_bytes = impl_->sent_tensor_bytes.load();
  t.controller_received_bytes = impl_->received_tensor_bytes.load();
  t.controller_message_bytes = impl_->message_bytes.load();
  t.worker_to_worker_bytes = impl_->worker_bytes.load();
  return t;
}

Traffic& Traffic::operator+=(const Traffic& o) {
  controller_sent_bytes += o.controller_sent_bytes;
  controller_received_bytes += o.controller_received_bytes;
  controller_message_bytes += o.controller_message_bytes;
  worker_to_worker_bytes += o.worker_to_worker_bytes;
  return *this;
}

Traffic Traffic::operator-(const Traffic& o) const {
  Traffic t = *this;
  t.controller_sent_bytes -= o.controller_sent_bytes;
  t.controller_received_bytes -= o.controller_received_bytes;
  t.controller_message_bytes -= o.controller_message_bytes;
  t.worker_to_worker_bytes -= o.worker_to_worker_bytes;
  return t;
}

bool data_plane_default() {
  const char* v = std::getenv("HF_DATA_PLANE");
  if (v == nullptr || *v == '\0') return true;
  const std::string s = v;
  HF_CHECK(s == "0" || s == "1", "HF_DATA_PLANE=", s, " must be 0 (off) or 1 (on)");
  return s == "1";
}

void ProcessPool::when_ready(const Future& input, std::function<void()> fn) {
  std::lock_guard<std::mutex> lock(impl_->waiters_mutex);
  auto& waiters = impl_->waiters;
  for (auto it = waiters.begin(); it != waiters.end();) {
    if (it->done->load()) {
      it->thread.join();
      it = waiters.erase(it);
    } else {
      ++it;
    }
  }
  auto done = std::make_shared<std::atomic<bool>>(false);
  waiters.push_back({std::thread([input, fn, done] {
                       input.wait();
                       fn();
                       done->store(true);
                     }),
                     done});
}

void ProcessPool::stop() {
  std::map<int64_t, Pending> failed;
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    if (impl_->stopping) return;
    impl_->stopping = true;
    failed.swap(impl_->pending);
  }
  for (auto& kv : failed)
    kv.second.on_error(std::make_exception_ptr(Error(detail::concat("resource pool '", impl_->spec.name,
                                                                    "' shut down before '", kv.second.role, ".",
                                                                    kv.second.method, "' finished"))));
}

void ProcessPool::shutdown() {
  std::call_once(impl_->shutdown_once, [this] {
    stop();
    std::vector<Impl::Waiter> waiters;
    {
      std::lock_guard<std::mutex> lock(impl_->waiters_mutex);
      waiters.swap(impl_->waiters);
    }
    for (auto& w : waiters) w.thread.join();
    {
      std::lock_guard<std::mutex> lock(impl_->mutex);
      for (size_t r = 0; r < impl_->ranks.size(); ++r)
        if (impl_->ranks[r].connected && impl_->ranks[r].alive)
          impl_->outbox.emplace_back(static_cast<int>(r),
                                     Message{"shutdown", {{"exit_code", impl_->failure.empty() ? 0 : 1}}, std::nullopt});
      impl_->exiting = true;
      // Spawned workers are waited for (then killed); external ones get a moment to receive the message.
      impl_->exit_deadline = Clock::now() + std::chrono::milliseconds(impl_->spec.spawn_workers ? 1000 : 200);
    }
    impl_->wake.notify();
    if (impl_->io.joinable()) impl_->io.join();
    if (impl_->pgid > 0) unregister_pgid(impl_->pgid);
  });
}

void enable_graceful_stop_on_signals() {
  g_graceful_stop = true;
  install_signal_handlers();  // also before any pool starts: a signal while loading data is graceful too
}

int stop_requested_signal() { return g_stop_signal.load(); }

}  // namespace hybridflow
