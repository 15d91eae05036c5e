// The c10d process groups of one role's processes under its layout (mesh_coord.h: tp fastest, then dp, then
// pp): the whole role, its tensor-parallel groups (the model's shards talk inside these), its data-parallel
// groups (ranks holding the same shard: gradients, metrics and row checks go over these) and its pipeline
// groups (one rank per stage: activations and their gradients pass along these).
//
// Rendezvous across hosts: the store is the one the controller's WorkerGroup hosts for the role
// (kProcessGroupKey in the role's config), reached at HF_CONTROLLER_ADDR, else at the host of
// HF_WORKER_ENDPOINT (the address this worker already reaches the controller by); Gloo binds to this host's
// address on the route there, not to a loopback-only hostname, and then connects the ranks directly.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>

#include "hybridflow/engine/pipeline.h"
#include "hybridflow/engine/train_engine.h"
#include "hybridflow/model/transformer.h"
#include "hybridflow/parallel/collectives.h"
#include "hybridflow/parallel/tensor_parallel.h"
#include "hybridflow/runtime/worker.h"

namespace hybridflow {

class RoleProcessGroups {
 public:
  // Collective over the role's ranks (each calls it from the same method or from register_methods). Error
  // when the role has one process or its config has no rendezvous.
  static std::unique_ptr<RoleProcessGroups> connect(const WorkerContext& context, torch::Device device);

  const ProcessGroup& world() const { return world_; }
  const ProcessGroup& data_parallel() const { return dp_; }
  // Valid as long as this object lives; size 1 (no communication) when the role's tp is 1.
  TensorParallelGroup tensor_parallel() const { return TensorParallelGroup(tp_.get()); }
  // This rank's pipeline stage (one stage holding the whole model when the role's pp is 1).
  PipelineStage pipeline_stage() const { return stage_; }
  // The communicator over this rank's pipeline group; null when pp is 1.
  Communicator* pipeline() const { return pp_.get(); }
  // The runner that moves `model`'s activations between the stages (engine/pipeline.h); null when pp is 1.
  std::shared_ptr<PipelineStageRunner> pipeline_runner(const CausalLM& model) const;

 private:
  ProcessGroup world_, dp_;
  std::unique_ptr<Communicator> tp_, pp_;
  PipelineStage stage_;
};

// Runs the role's model over `batch` in micro-batches of `micro_batch_size` rows and returns the rows of
// `last_stage(micro)` concatenated (last_stage runs the model's forward); with pipeline stages they pass
// through every stage and only the last returns rows (undefined elsewhere: the batch protocol collects the
// last stage's).
torch::Tensor forward_micro_batches(PipelineStageRunner* pipeline, const DataProto& batch, int64_t micro_batch_size,
                                    const std::function<torch::Tensor(const DataProto&)>& last_stage);

// Tells `engine` which of `model`'s parameters its tensor-parallel group splits, so gradient norms sum over
// the group (no-op when the model is not split).
void use_model_split(TrainEngine& engine, const CausalLM& model);
// use_model_split, and with pipeline stages the engine runs 1F1B over them (null pipeline: no stages).
void use_model_layout(TrainEngine& engine, const CausalLM& model, std::shared_ptr<PipelineStageRunner> pipeline);

// The protocol of a role's batch methods: the batch splits over data-parallel groups and every rank of a
// tensor-parallel group sees its group's rows (3D_PROTO); plain DP_PROTO when tp is 1, which is the same.
const char* batch_protocol(const MeshCoord& coord);
// The protocol of generation: prompts split over generation replicas by their number (3D_ALL_MICRO_DP), so
// that a replica's prompts and sampling seed are the same in every layout; DP_PROTO without tensor and
// pipeline parallelism, where replica r is rank r.
const char* rollout_protocol(const MeshCoord& coord);

// A process group of `world` ranks over a TCPStore the controller hosts (`rendezvous`: store_port,
// optional store_host and timeout_s), reached where this worker reaches the controller; Gloo on the CPU,
// NCCL for CUDA devices. Collective over the `world` ranks. Roles join their own group this way, and a
// standalone rollout's weight sync one spanning the actor's and the rollout's processes.
ProcessGroup join_controller_store_group(const nlohmann::json& rendezvous, int rank, int world, torch::Device device);

}  // namespace hybridflow
