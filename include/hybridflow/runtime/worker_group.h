// A worker group as the controller sees it: one role (actor, critic, ...) over the ranks of a pool.
// call() returns at once; the transfer protocol of the method splits the input across ranks and
// merges their outputs into the Future.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "hybridflow/runtime/call_timeline.h"
#include "hybridflow/runtime/future.h"
#include "hybridflow/runtime/mesh_coord.h"
#include "hybridflow/transport/process_pool.h"

namespace hybridflow {

class StoreServer;

// Config key the group adds for its workers when it has more than one process:
// {"store_port": port of the controller's TCPStore, "world_size": ranks}. Workers reach the store at the
// host of the endpoint they use for the controller (see workers/data_parallel.h).
inline constexpr const char* kProcessGroupKey = "hf_process_group";

class WorkerGroup {
 public:
  // Creates `worker_type` as `role` in every process of `pool`. Blocking; Error if the type is unknown
  // in the worker binary or the pool size does not fit the layout. With more than one process the group
  // also hosts the rendezvous store of the role's c10d process group (kProcessGroupKey in the config).
  WorkerGroup(std::shared_ptr<ProcessPool> pool, const std::string& role, const std::string& worker_type,
              const ParallelLayout& layout = {}, const nlohmann::json& config = nlohmann::json::object());

  Future call(const std::string& method, const DataProto& input = DataProto());
  Future call(const std::string& method, const Future& input);  // dispatched when input resolves

  const std::string& role() const { return role_; }
  int world_size() const { return static_cast<int>(coords_.size()); }
  const std::vector<MeshCoord>& coords() const { return coords_; }
  const std::map<std::string, std::string>& methods() const { return methods_; }  // name -> protocol
  ProcessPool& pool() const { return *pool_; }
  // Every call from now on (by this group or a copy made later) is recorded in `timeline` when it
  // returns; null stops recording.
  void record_calls(std::shared_ptr<CallTimeline> timeline) { timeline_ = std::move(timeline); }

 private:
  // The input is `value`, or the result `from` (whose kept rows the ranks may fetch themselves).
  void start_call(const std::string& method, const DataProto* value, std::shared_ptr<const CallResult> from,
                  std::shared_ptr<Promise> promise) const;

  std::shared_ptr<ProcessPool> pool_;
  std::string role_;
  std::vector<MeshCoord> coords_;
  std::map<std::string, std::string> methods_;
  std::shared_ptr<StoreServer> store_;  // lives as long as any copy of the group
  std::shared_ptr<CallTimeline> timeline_;
};

}  // namespace hybridflow
