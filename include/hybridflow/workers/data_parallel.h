// Data-parallel training inside a worker group: the ranks of one data-parallel group (role_process_groups.h;
// with tp = 1, the whole role) each train on their shard of the batch; TrainEngine sums the weighted
// gradients over the group through a Communicator before clipping, so every replica takes the step that
// one process would take on the whole mini-batch and the parameters stay identical.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "hybridflow/parallel/collectives.h"
#include "hybridflow/engine/train_engine.h"
#include "hybridflow/workers/ppo_epochs.h"

namespace hybridflow {

class DataParallel {
 public:
  // Null when `group` has one rank. Collective over the group: broadcasts its rank 0's parameters of
  // `module` (so replicas start equal whatever each loaded) and installs the gradient reducer in `engine`,
  // or with `sharded_optimizer` the ZeRO-1 optimizer that partitions its state over the group (verl's
  // megatron.use_distributed_optimizer). `module` and `engine` must outlive the returned object.
  // With `experts_per_rank` (expert parallelism) the experts are each rank's own and are not broadcast.
  static std::unique_ptr<DataParallel> join(const ProcessGroup& group, const std::string& role,
                                            torch::nn::Module& module, TrainEngine& engine,
                                            bool sharded_optimizer = false, bool experts_per_rank = false);

  int rank() const { return gradients_.rank(); }
  int size() const { return gradients_.size(); }

  // Throws on every rank when the ranks hold different numbers of rows: they would take different
  // numbers of optimizer steps and wait on each other's collectives forever.
  void check_same_rows(int64_t rows, const std::string& what);
  // The mean of every metric over all ranks' micro-batches (ranks may report different metric names),
  // plus <prefix>dp_allreduce_bytes and <prefix>dp_allreduce_s: this rank's gradient all-reduce volume
  // and time since the previous call (with the ZeRO optimizer, its reduce-scatter and all-gather: they
  // replace the all-reduce).
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
  OpStats reported_;  // gradient collective totals at the previous metrics() call
};

// Left-pads a rollout's prompts (tensors prompts, input_ids, attention_mask, and routed_experts with -1 when
// there) to `width` columns. Each
// data-parallel rank generates from its shard padded to the shard's longest prompt; padding back to the
// width of the batch the controller split makes the ranks' rollouts concatenate. Positions follow the
// attention mask, so the extra padding changes no log-prob.
DataProto left_pad_prompts(const DataProto& rollout, int64_t width, int64_t pad_id);

// The module's parameters as one fp32 row [1, P] under "parameters": tests compare replicas with it.
DataProto flat_parameters(torch::nn::Module& module);

}  // namespace hybridflow
