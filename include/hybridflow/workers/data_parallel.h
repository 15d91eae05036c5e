// Data-parallel training inside a worker group. A role with more than one process (actor, critic) joins
// one c10d process group over its ranks (Gloo; NCCL when libtorch has it and CUDA is there) at its first
// update, through the TCPStore the controller's WorkerGroup hosts for it (kProcessGroupKey in the role's
// config). Each rank trains on its DP_PROTO shard; TrainEngine sums the weighted gradients over the ranks
// through a Communicator before clipping, so every replica takes the step that one process would take on
// the whole mini-batch and the parameters stay identical.
//
// Rendezvous across hosts: the store is at HF_CONTROLLER_ADDR, else the host of HF_WORKER_ENDPOINT (the
// address this worker already reaches the controller by), and Gloo binds to this host's address on the
// route there, not to a loopback-only hostname. Gloo then connects the ranks to each other directly.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "hybridflow/parallel/collectives.h"
#include "hybridflow/engine/train_engine.h"
#include "hybridflow/runtime/worker.h"
#include "hybridflow/workers/ppo_epochs.h"

namespace hybridflow {

class DataParallel {
 public:
  // Null when the role has one process. Collective over the role's ranks: joins the process group,
  // broadcasts rank 0's parameters of `module` (so replicas start equal whatever each loaded) and
  // installs the gradient reducer in `engine`. `module` and `engine` must outlive the returned object.
  static std::unique_ptr<DataParallel> join(const WorkerContext& context, torch::nn::Module& module,
                                            TrainEngine& engine);

  int rank() const { return gradients_.rank(); }
  int size() const { return gradients_.size(); }

  // Throws on every rank when the ranks hold different numbers of rows: they would take different
  // numbers of optimizer steps and wait on each other's collectives forever.
  void check_same_rows(int64_t rows, const std::string& what);
  // The mean of every metric over all ranks' micro-batches (ranks may report different metric names),
  // plus <prefix>dp_allreduce_bytes and <prefix>dp_allreduce_s: this rank's gradient all-reduce volume
  // and time since the previous call.
  nlohmann::json metrics(const MetricAverager& local, const std::string& prefix);
  // {"gradient": {op: {calls, bytes, seconds}}, "control": {...}}: the gradient sum and parameter
  // broadcast apart from the small control collectives (row check, metrics), cumulative since join.
  nlohmann::json comm_stats() const;

 private:
  DataParallel(ProcessGroup group, std::string role, torch::Device device);

  std::string role_;
  torch::Device device_;  // of the replica's parameters; every collective's tensors live there
  Communicator gradients_;  // accounts the gradient all-reduce and the initial broadcast only
  Communicator control_;
  OpStats reported_;  // gradient all-reduce totals at the previous metrics() call
};

// "tcp://10.0.0.5:4000" -> "10.0.0.5" ("[::1]:4000" -> "::1"); Error when there is no host.
std::string endpoint_host(const std::string& endpoint);

// This host's address on the route to `host` (a connected UDP socket; nothing is sent).
std::string local_address_towards(const std::string& host);

// Left-pads a rollout's prompts (tensors prompts, input_ids, attention_mask) to `width` columns. Each
// data-parallel rank generates from its shard padded to the shard's longest prompt; padding back to the
// width of the batch the controller split makes the ranks' rollouts concatenate. Positions follow the
// attention mask, so the extra padding changes no log-prob.
DataProto left_pad_prompts(const DataProto& rollout, int64_t width, int64_t pad_id);

// The module's parameters as one fp32 row [1, P] under "parameters": tests compare replicas with it.
DataProto flat_parameters(torch::nn::Module& module);

}  // namespace hybridflow
