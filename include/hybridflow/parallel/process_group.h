// A c10d process group behind a thin handle, so that users never include the heavy c10d headers.
//
// create_world() connects the ranks of a LaunchEnv through a TCPStore hosted by rank 0 on
// master_addr:master_port and builds a Gloo group for CPU tensors or an NCCL group for CUDA tensors.
// Sub-groups share the world's store through a PrefixStore each; only their members construct them.
// All operations block until done; ranks are group-local. Every collective is normally called through
// Communicator (collectives.h), which accounts bytes and time.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "hybridflow/parallel/launch_env.h"

namespace hybridflow {

struct ProcessGroupOptions {
  // Where the tensors of every collective live: "cpu" or "cuda" (this process's current CUDA device).
  std::string device = "cpu";
  // "gloo" (CPU tensors), "nccl" (CUDA tensors; needs the CUDA build) or "auto" (the one for `device`).
  // A backend that does not fit the device is an error at creation, not at the first collective.
  std::string backend = "auto";
  // Gloo transport: bind to this interface name ("eth0") when set, else to the address of this hostname.
  // The default loopback only works when all ranks are on one host; use the host's address for multi-host.
  std::string gloo_interface;
  std::string gloo_hostname = "127.0.0.1";
  // Store connect/wait and collective timeout: a dead peer becomes an error instead of a hang.
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
  // false: the TCPStore at master_addr:master_port is hosted by someone else (a StoreServer, e.g. in the
  // controller) and rank 0 joins it as a client like every other rank.
  bool rank0_hosts_store = true;
};

enum class ReduceOp { kSum, kAvg, kMax, kMin, kProduct };

class ProcessGroup {
 public:
  // Rendezvous of all ranks of env (collective: every rank must call it).
  static ProcessGroup create_world(const LaunchEnv& env, const ProcessGroupOptions& options = {});

  ProcessGroup() = default;  // an empty handle: valid() is false
  bool valid() const { return static_cast<bool>(state_); }

  int rank() const;        // rank inside this group
  int size() const;
  int world_rank() const;  // rank in the world group this group was made from
  const std::vector<int>& world_ranks() const;  // members as world ranks, in group-rank order
  const std::string& backend() const;           // "gloo" or "nccl"
  // The value of `key` in the rendezvous store (the raw store, outside the group's prefix), "" when unset:
  // a side channel one party of the store (the controller hosting it) writes and the ranks poll.
  std::string store_value(const std::string& key) const;

  // A group of the given world ranks (ascending or not: group rank i is world_ranks[i]). Only members call
  // it, all with the same list, in the same order as their other new_group calls of that list.
  ProcessGroup new_group(const std::vector<int>& world_ranks) const;
  // Every world rank calls this with the same partition (e.g. DeviceMesh::tp_groups()) and gets the group
  // that contains it. Throws when the lists are not a partition of the world.
  ProcessGroup split(const std::vector<std::vector<int>>& partition) const;

  // Blocking c10d operations (no accounting; prefer Communicator).
  void allreduce(at::Tensor& tensor, ReduceOp op) const;
  void allgather(std::vector<at::Tensor>& outputs, const at::Tensor& input) const;
  // all_gather_into_tensor: output (contiguous, size() x input's elements) holds rank r's input at chunk r.
  void allgather_into(at::Tensor& output, const at::Tensor& input) const;
  // reduce_scatter_tensor: output (contiguous, input's elements / size()) gets chunk rank() of the reduction.
  void reduce_scatter_into(at::Tensor& output, const at::Tensor& input, ReduceOp op) const;
  // all_to_all_single with equal splits: input's chunk j of dim 0 goes to rank j; output (contiguous, input's
  // shape) holds at chunk i what rank i sent this rank.
  void alltoall_into(at::Tensor& output, const at::Tensor& input) const;
  // all_to_all_single with uneven splits: input's rows [sum(input_rows[:j]), + input_rows[j]) go to rank j;
  // output (contiguous, sum(output_rows) rows) holds what rank i sent at rows [sum(output_rows[:i]), ...).
  // Every rank's input_rows[j] must equal rank j's output_rows[rank()] (exchange the counts first).
  void alltoallv_into(at::Tensor& output, const at::Tensor& input, const std::vector<int64_t>& output_rows,
                      const std::vector<int64_t>& input_rows) const;
  void broadcast(at::Tensor& tensor, int root) const;
  void barrier() const;
  void send(const at::Tensor& tensor, int dst, int tag) const;
  void recv(at::Tensor& tensor, int src, int tag) const;
  // A send that returns at once; the transfer completes by the handle's wait() (or its destructor). For
  // schedules where both neighbours send before they receive (pipeline 1F1B), which blocking sends deadlock.
  class PendingSend;
  PendingSend isend(const at::Tensor& tensor, int dst, int tag) const;

  struct State;

 private:
  explicit ProcessGroup(std::shared_ptr<State> state) : state_(std::move(state)) {}
  const State& state() const;
  std::shared_ptr<State> state_;
};

// Owns the tensor in flight; wait() is idempotent and rethrows a failed transfer.
class ProcessGroup::PendingSend {
 public:
  PendingSend();
  PendingSend(PendingSend&&) noexcept;
  PendingSend& operator=(PendingSend&&) noexcept;
  ~PendingSend();  // waits (errors are logged, not thrown)
  void wait();
  bool pending() const { return static_cast<bool>(work_); }

  struct Work;

 private:
  friend class ProcessGroup;
  explicit PendingSend(std::unique_ptr<Work> work);
  std::unique_ptr<Work> work_;
};

}  // namespace hybridflow
