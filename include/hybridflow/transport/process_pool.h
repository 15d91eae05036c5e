// A resource pool: a named set of process slots (one per device) and the worker processes the
// controller spawned for it. Roles placed in the same pool are colocated: they live in the same
// processes and their calls run one after another; different pools run concurrently.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "hybridflow/core/data_proto.h"

namespace hybridflow {

// HF_DATA_PLANE: "0" turns the data plane off for pools created from then on (ResourcePool::data_plane).
bool data_plane_default();

// Bytes that crossed the controller's sockets, and bytes that went from worker to worker instead.
// Tensor bytes count the DataProto payloads (what the data plane avoids moving); message bytes count every
// frame of every message but heartbeats (the control traffic and JSON headers too).
struct Traffic {
  uint64_t controller_sent_bytes = 0;       // tensor bytes the controller sent to workers
  uint64_t controller_received_bytes = 0;   // tensor bytes it received from them
  uint64_t controller_message_bytes = 0;    // all frames, both ways
  uint64_t controller_messages = 0;         // the messages themselves, both ways (a batch is one each way)
  uint64_t worker_to_worker_bytes = 0;      // tensor bytes workers fetched from other worker processes
  uint64_t controller_bytes() const { return controller_sent_bytes + controller_received_bytes; }
  Traffic& operator+=(const Traffic& other);
  Traffic operator-(const Traffic& other) const;
};

struct ResourcePool {
  std::string name = "default";
  int num_processes = 1;               // one per device; all on this node in the embedded launch
  double call_timeout_s = 600;         // a call running longer is a hang: the pool fails
  double heartbeat_timeout_s = 30;     // silence from a worker this long means it is gone
  double start_timeout_s = 60;         // for all workers to connect
  std::string executable;              // binary to exec; empty = this process's own (/proc/self/exe)
  std::vector<std::string> args;       // argv[1..] for it
  std::string bind_host = "127.0.0.1";
  int bind_port = 0;                   // 0 = any free port
  // false: do not spawn; wait for num_processes workers started elsewhere (srun, mpirun, ssh) with
  // HF_WORKER_ENDPOINT / HF_WORKER_TOKEN / HF_WORKER_RANK set, which then call run_worker_main.
  // Their crashes are seen through heartbeats only, and the controller cannot kill them.
  bool spawn_workers = true;
  // Extra environment for spawned workers (OMP_NUM_THREADS, CUDA_VISIBLE_DEVICES, ...). Each worker
  // also gets HF_WORKER_RANK (its rank in the pool) and LOCAL_RANK = local_rank_offset + rank, the
  // torchrun variable a worker picks its CUDA device by; pools on one node take disjoint offsets.
  std::map<std::string, std::string> env;
  int local_rank_offset = 0;
  std::string token;                   // job secret (>= 32 characters); empty = a random one (required to share for external workers)
  // The data plane (docs/ARCHITECTURE.md): calls of row-wise protocols leave their outputs' bulk tensors
  // (more than inline_row_bytes per row) on the workers, and a call given such a result fetches its rows
  // from the producing workers directly; the controller moves only handles, metadata and small tensors.
  bool data_plane = data_plane_default();
  int64_t inline_row_bytes = 16;                  // per-row tensors this small travel with the answer
  int64_t object_table_bytes = int64_t(4) << 30;  // the most each worker keeps; beyond, outputs travel as before
  double data_fetch_timeout_s = 60;               // a producer silent this long fails the consumer's call
  // Key of worker-to-worker messages (>= 32 characters): workers of pools with the same data token fetch
  // from each other. Empty: the pool's token. Controller::add_pools gives its pools one shared secret;
  // external workers read it from HF_WORKER_DATA_TOKEN (else use HF_WORKER_TOKEN).
  std::string data_token;
  // Ranks that share a worker process (simulated workers, HF_WORKER_RANK_COUNT in worker_main.h) get a
  // request they all get alike (a one-to-all call) as one message per process, answered by one merged reply
  // that keeps each rank's result or error apart. false: one message per rank, as for ranks alone in a process.
  bool batch_calls = true;
};

class ProcessPool {
 public:
  // Spawns the workers and waits until all of them connected. Error (and no process left) on failure.
  static std::shared_ptr<ProcessPool> start(const ResourcePool& spec);
  ~ProcessPool();  // shutdown()
  ProcessPool(const ProcessPool&) = delete;
  ProcessPool& operator=(const ProcessPool&) = delete;

  const ResourcePool& spec() const;
  int size() const;
  std::vector<int> pids() const;
  std::string endpoint() const;     // where the controller listens, e.g. tcp://127.0.0.1:40123
  std::string token() const;        // the job secret the message key is derived from (never sent)
  size_t rejected_messages() const;  // forged, replayed, oversized, malformed or from a wrong peer: dropped and logged
  // True once a failure was detected AND handled: every worker killed and reaped, pending calls failed.
  bool failed() const;
  std::string failure() const;       // empty unless failed()
  // Whether the pool failed; a failure detected but still being handled is waited for, so that on true
  // every worker is killed and reaped (the calls pending at the failure fail on the I/O thread, all of them
  // once shutdown() returned). Controller::restart_pool starts the pool's processes again.
  bool wait_failed() const;

  // Instantiates `worker_type` as `role` in every process (coords[i], the rank's place in the role's
  // layout, passed on unread to rank i); returns the role's methods and their protocols. Blocking.
  std::map<std::string, std::string> create_role(const std::string& role, const std::string& worker_type,
                                                 const std::vector<nlohmann::json>& coords, const nlohmann::json& config);

  // Sends inputs[i] to rank i; on_done gets the outputs indexed by rank, on_error the failure.
  // Both run on the pool's I/O thread.
  void submit(const std::string& role, const std::string& method, std::vector<DataProto> inputs,
              std::function<void(std::vector<DataProto>&&)> on_done,
              std::function<void(std::exception_ptr)> on_error);

  // Runs fn on a helper thread, joined at shutdown (a call whose input resolved: it may wait on other
  // pools, which the I/O thread that resolved the input must not). False, fn not run, once shutdown began.
  bool run_on_helper(std::function<void()> fn);

  // ---- The data plane (runtime/data_plane.cpp drives these; algorithm code needs none of them) ----
  struct RankInput {
    DataProto data;
    nlohmann::json plan;  // rows the rank fetches from workers before the method runs (null: none)
  };
  struct RankOutput {
    DataProto data;
    nlohmann::json kept;  // {object, tensors: [{key, dtype, shape}]} left on the worker (null: none)
  };
  // submit() with plans; keep_outputs asks the ranks to keep their outputs' bulk tensors.
  void submit(const std::string& role, const std::string& method, std::vector<RankInput> inputs, bool keep_outputs,
              std::function<void(std::vector<RankOutput>&&)> on_done,
              std::function<void(std::exception_ptr)> on_error);
  // Rows `runs` ([start, count] each) of `keys` of object `object` kept by `rank`, the output of
  // role.method (named in errors).
  void fetch(int rank, int64_t object, const std::vector<std::string>& keys,
             const std::vector<std::pair<int64_t, int64_t>>& runs, const std::string& role, const std::string& method,
             std::function<void(DataProto&&)> on_done, std::function<void(std::exception_ptr)> on_error);
  // Tells every rank to drop the object (no answer; nothing once the pool stopped).
  void release(int64_t object);
  struct RankInfo {
    int pid = -1;
    std::string host;
    std::string data_endpoint;  // empty: the rank has no data socket
    int node = -1;              // its number among the job's workers (pool index << 16 | rank)
  };
  RankInfo rank_info(int rank) const;
  bool keeps_outputs() const;  // spec().data_plane and every rank serves a data socket
  // Workers of the two pools can fetch from each other (the same data key).
  bool shares_data_key(const ProcessPool& other) const;
  struct HeldObjects {
    int64_t objects = 0;   // kept outputs, summed over ranks, as of their last heartbeats
    int64_t bytes = 0;
    size_t rejected_requests = 0;  // data-socket messages the workers dropped (forged, replayed, oversized)
  };
  HeldObjects held_objects() const;
  Traffic traffic() const;  // since the pool started

  // Asks workers to exit, kills any that do not within a second, reaps all. Idempotent.
  void shutdown();
  // Stops accepting work and fails pending calls; used before joining helper threads across pools.
  void stop();

  struct Impl;

 private:
  explicit ProcessPool(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

// SIGINT / SIGTERM / SIGHUP / SIGQUIT kill every pool's workers (their own process groups: a terminal's
// Ctrl-C reaches only the controller) and then the process. After enable_graceful_stop_on_signals() the
// first SIGINT or SIGTERM only records itself, so a training loop can end cleanly between steps
// (stop_requested_signal() returns it); a second one kills as before.
void enable_graceful_stop_on_signals();
int stop_requested_signal();  // 0 while no stop was requested

}  // namespace hybridflow
