// A resource pool: a named set of process slots (one per device) and the worker processes the
// controller spawned for it. Roles placed in the same pool are colocated: they live in the same
// processes and their calls run one after another; different pools run concurrently.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "hybridflow/core/data_proto.h"
#include "hybridflow/runtime/future.h"
#include "hybridflow/runtime/mesh_coord.h"

namespace hybridflow {

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

  // Instantiates `worker_type` as `role` in every process (coords[i] for rank i); returns the
  // role's methods and their protocols. Blocking.
  std::map<std::string, std::string> create_role(const std::string& role, const std::string& worker_type,
                                                 const std::vector<MeshCoord>& coords, const nlohmann::json& config);

  // Sends inputs[i] to rank i; on_done gets the outputs indexed by rank, on_error the failure.
  // Both run on the pool's I/O thread.
  void submit(const std::string& role, const std::string& method, std::vector<DataProto> inputs,
              std::function<void(std::vector<DataProto>&&)> on_done,
              std::function<void(std::exception_ptr)> on_error);

  // Runs fn on a helper thread once `input` resolved (joined at shutdown).
  void when_ready(const Future& input, std::function<void()> fn);

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
