// The model a training role optimises (the actor's policy, the critic's value model) with the plumbing
// every such role needs and none owns: its TrainEngine (bf16/fp16 weights keep fp32 masters there), the
// split over the role's tensor-parallel groups and pipeline stages, data-parallel training with optional
// ZeRO-1 (workers/data_parallel.h), param_offload / optimizer_offload (workers/role_memory.h) and the
// checkpoint save/restore (workers/checkpoint_io.h). A role holds one as a member and keeps only what is
// its own: its loss, its inference methods and, for the actor, the rollout and reference models.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "hybridflow/core/data_proto.h"
#include "hybridflow/engine/train_engine.h"
#include "hybridflow/model/transformer.h"
#include "hybridflow/runtime/worker.h"
#include "hybridflow/workers/data_parallel.h"
#include "hybridflow/workers/expert_parallel_ranks.h"
#include "hybridflow/workers/ppo_epochs.h"
#include "hybridflow/workers/role_memory.h"
#include "hybridflow/workers/role_process_groups.h"
#include "hybridflow/workers/role_specs.h"

namespace hybridflow {

class TrainableModel {
 public:
  // Builds `spec`'s model with `head` on `device`, split as `groups` says (null: the role is one process;
  // `groups` must outlive this object), and its engine with `train`'s optimizer. Collective over the
  // role's data-parallel group (the replicas start from its rank 0's weights). The weights stay on the
  // device until offload_params().
  TrainableModel(const WorkerContext& context, torch::Device device, const RoleProcessGroups* groups,
                 const ModelSpec& spec, HeadKind head, const TrainSpec& train);
  TrainableModel(const TrainableModel&) = delete;
  TrainableModel& operator=(const TrainableModel&) = delete;

  CausalLM& model() { return model_; }
  const CausalLM& model() const { return model_; }
  // The runner over the role's pipeline stages; null without stages.
  PipelineStageRunner* pipeline() const { return pipeline_.get(); }
  // The expert-parallel groups; null without expert parallelism.
  const ExpertParallelRanks* expert_parallel() const { return experts_.get(); }

  // Weights to host memory when param_offload asks (a role does this once it is set up).
  void offload_params() { offload_.offload_params(*model_); }
  // The weights on the compute device for a method's scope:  auto on = trainable_.params_on_device();
  [[nodiscard]] ParamsOnDevice params_on_device() { return ParamsOnDevice(offload_, *model_); }

  // One update call (call it with the weights on the device): the batch `in` over `plan`'s epochs and
  // mini-batches with `loss_fn`, the optimizer state on the device meanwhile (optimizer_offload). `what`
  // names the call in errors. Adds <prefix>optimizer_state_bytes to `metrics`. Returns one row per rank
  // (update_rank) with meta "metrics" (averaged over the data-parallel group) and, data-parallel, "comm".
  DataProto update(const DataProto& in, const MiniBatchPlan& plan, const MicroLossFn& loss_fn,
                   const std::string& prefix, MetricAverager& metrics, const std::string& what);

  // The methods every training role serves, with the weights on the device for their scope:
  DataProto parameter_norm();                      // param_sq_norm [1], summed over shards and stages
  DataProto flat_parameters();                     // parameters [1, P] fp32
  DataProto save_checkpoint(const DataProto& in);  // meta dir, tokenizer (workers/checkpoint_io.h)
  // meta dir; `refresh` runs after the restore while the weights are still on the device (the actor's rollout
  // copy follows the restored weights there without a second host <-> device move under param_offload).
  DataProto load_checkpoint(const DataProto& in, const std::function<void()>& refresh = {});
  // meta dir, base (base_model_name_or_path): the LoRA adapters as a PEFT directory (workers/checkpoint_io.h).
  DataProto save_lora_adapter(const DataProto& in);

 private:
  std::string role_;
  MeshCoord coord_;
  const RoleProcessGroups* groups_;
  CausalLM model_{nullptr};
  std::shared_ptr<PipelineStageRunner> pipeline_;  // when the role has pipeline stages
  std::unique_ptr<ExpertParallelRanks> experts_;  // expert_model_parallel_size > 1; before engine_
  std::unique_ptr<TrainEngine> engine_;
  std::unique_ptr<DataParallel> dp_;  // when a data-parallel group has several ranks; after engine_
  RoleOffload offload_;               // param_offload / optimizer_offload
};

}  // namespace hybridflow
