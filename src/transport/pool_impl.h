// The state of one resource pool (process_pool.h), shared by the files that implement it, one concern
// each: process_pool.cpp (starting a pool, its public calls, shutdown), pool_processes.cpp (spawning,
// reaping, health), pool_message_loop.cpp (the I/O thread: messages in and out, pending calls),
// pool_accounting.cpp (traffic and kept objects) and pool_signals.cpp (signals that must kill workers).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "hybridflow/transport/process_pool.h"
#include "message.h"

namespace hybridflow::transport_detail {

using PoolClock = std::chrono::steady_clock;

// A worker's node on the data plane is pool index << 16 | rank.
inline constexpr int kMaxPoolRanks = 1 << 16;

struct RankState {
  int pid = -1;
  std::string host = "?";
  std::string identity;
  std::string data_endpoint;  // its data socket, from its hello (empty: none)
  int64_t objects = 0, object_bytes = 0;  // what it keeps, from its last heartbeat
  size_t data_rejected = 0;
  bool connected = false;
  bool alive = true;  // not reaped yet
  PoolClock::time_point last_seen;
  // Ranks sharing a worker process (simulated workers) get a request every rank gets alike as one batch,
  // through the process's lowest rank (runtime/rank_batch.h). From its hello: its process and whether it
  // takes batches; once all ranks connected: the rank leading its process's batches (-1: alone in its process,
  // never batched).
  int64_t process_pid = -1;
  bool takes_batches = false;
  int batch_leader = -1;
  int64_t last_call = 0;  // of a batched rank: the create or call sent to it last (its requests' "after")
};

struct Pending {
  std::string role, method;
  std::vector<bool> addressed;  // the ranks asked (a fetch asks one)
  std::vector<std::optional<Message>> replies;
  std::vector<int> via;  // the rank whose merged reply answers for each rank (-1: its own reply)
  int remaining = 0;
  PoolClock::time_point deadline;
  std::function<void(std::vector<Message>&&)> on_done;
  std::function<void(std::exception_ptr)> on_error;
};

// pool_signals.cpp: process groups of live pools, killed by SIGINT / SIGTERM / SIGHUP / SIGQUIT.
void install_signal_handlers();
void register_pgid(int pgid);
void unregister_pgid(int pgid);

// pool_processes.cpp: "exited with code 3", "was killed by signal 9 (Killed)".
std::string describe_exit(int status);

}  // namespace hybridflow::transport_detail

namespace hybridflow {

struct ProcessPool::Impl {
  using Clock = transport_detail::PoolClock;
  using Message = transport_detail::Message;
  using RankState = transport_detail::RankState;
  using Pending = transport_detail::Pending;

  ResourcePool spec;
  std::string token;  // the job secret: only its derived key is used on the wire
  std::string endpoint;
  std::unique_ptr<transport_detail::Link> link;  // I/O thread only
  std::unique_ptr<transport_detail::RejectLog> reject_log;
  zmq::context_t context{1};
  zmq::socket_t router{context, zmq::socket_type::router};
  transport_detail::WakePipe wake;

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
  std::atomic<uint64_t> messages{0};  // sent and received, heartbeats not counted
  std::mutex release_mutex;       // taken after `mutex`, never before it
  std::vector<int64_t> releases;  // objects to release on every rank (sent by the I/O thread)

  // Helper threads (run_on_helper); finished ones are joined on the next start so a long run does not
  // accumulate threads, the rest at shutdown, after which no new one starts.
  struct Waiter {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::mutex waiters_mutex;
  std::vector<Waiter> waiters;
  bool helpers_closed = false;
  std::thread io;
  std::once_flag shutdown_once;

  std::string where(int rank) const;
  // What `rank` was busy with, for failure messages.
  std::string running_on(int rank) const;
  int node_of(int rank) const { return (pool_index << 16) | rank; }
  // Once every rank connected: which ranks share a process, and who leads each process's batches.
  void group_ranks_by_process();

  // pool_processes.cpp
  void spawn();
  void kill_and_reap_all();
  // Marks the pool failed, kills every worker and fails every pending call with `message`.
  void fail(const std::string& message);
  // Dead children, overdue calls, silent workers. Returns the failure to raise, empty if healthy.
  std::string check_health();

  // pool_message_loop.cpp
  void loop();
  void handle(transport_detail::Received& received, std::vector<std::function<void()>>& callbacks);
  // Records rank's reply to pending call `it`: completes the call with its last reply, fails it with an
  // error. True when the call is over (`it` erased).
  bool answer(std::map<int64_t, Pending>::iterator it, int rank, Message m, std::vector<std::function<void()>>& callbacks);
  // A merged reply of a batch (runtime/rank_batch.h): every part as if its rank had answered alone.
  void handle_batch_results(transport_detail::Received& received, Message& m, int leader,
                            std::vector<std::function<void()>>& callbacks);
  // Drops a message that must not reach the run: counted, logged once per peer and kind of rejection.
  void reject(const transport_detail::Received& received, const std::string& code, const std::string& why);
  // Registers a request to the ranks that have a message (messages[i] goes to rank i); on_done gets the
  // replies indexed by rank, empty for ranks not asked.
  void request(const std::string& kind, const std::string& role, const std::string& method,
               std::vector<std::optional<Message>> messages, std::function<void(std::vector<Message>&&)> on_done,
               std::function<void(std::exception_ptr)> on_error);
};

}  // namespace hybridflow
