// The single controller: owns the resource pools (and so every worker process) of a job. Workers
// die with it: on destruction, on an uncaught error (they are killed by the kernel when the
// controller process dies) and on SIGINT/SIGTERM (the handler kills their process groups).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "hybridflow/transport/process_pool.h"
#include "hybridflow/runtime/worker_group.h"

namespace hybridflow {

class Controller {
 public:
  Controller() = default;
  ~Controller();
  Controller(const Controller&) = delete;
  Controller& operator=(const Controller&) = delete;

  std::shared_ptr<ProcessPool> add_pool(const ResourcePool& spec);  // Error on a duplicate name
  // Starts several pools at once: worker start-up (loading libtorch) overlaps instead of adding up.
  // On any failure no pool of the batch is kept (and no worker survives); the first Error is thrown.
  std::vector<std::shared_ptr<ProcessPool>> add_pools(const std::vector<ResourcePool>& specs);
  std::shared_ptr<ProcessPool> pool(const std::string& name) const;
  WorkerGroup create_group(const std::string& pool_name, const std::string& role, const std::string& worker_type,
                           const ParallelLayout& layout = {},
                           const nlohmann::json& config = nlohmann::json::object());
  // Replaces a failed pool (one whose workers died) by a fresh one of the same spec: the old one is shut
  // down, which fails whatever was still pending on it, and new workers are spawned and connected. Roles
  // must be created on it again. Error for a pool whose workers a launcher (torchrun, mpirun, srun) or
  // someone else started: the controller cannot start those again.
  std::shared_ptr<ProcessPool> restart_pool(const std::string& name);
  void shutdown();  // all pools; idempotent

  // Bytes through the controller's sockets and between workers (all pools) since the previous call; the
  // trainer logs them per step (perf/controller_bytes, perf/worker_to_worker_bytes).
  Traffic take_traffic();

 private:
  ResourcePool with_data_token(ResourcePool spec);
  Traffic total_traffic() const;

  std::map<std::string, std::shared_ptr<ProcessPool>> pools_;
  // The data plane's secret, shared by the pools this controller spawns, so that their workers fetch
  // from each other (ResourcePool::data_token). Never sent: spawned workers get it in their environment.
  std::string data_secret_;
  Traffic retired_;  // of pools already shut down
  Traffic taken_;    // totals at the last take_traffic()
};

}  // namespace hybridflow
