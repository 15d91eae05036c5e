#include "hybridflow/workers/role_process_groups.h"

#include <cstdlib>

#include "hybridflow/core/error.h"
#include "hybridflow/model/tensor_parallel_layout.h"
#include "hybridflow/parallel/device_mesh.h"
#include "hybridflow/parallel/launch_env.h"
#include "hybridflow/transport/launcher.h"
#include "hybridflow/transport/net_address.h"
#include "hybridflow/runtime/protocol.h"
#include "hybridflow/runtime/worker_group.h"
#include "hybridflow/workers/expert_parallel_ranks.h"

namespace hybridflow {

ProcessGroup join_controller_store_group(const nlohmann::json& rendezvous, int rank, int world, torch::Device device) {
  // The store runs in the controller: reach it where this worker reached the controller.
  const char* controller = std::getenv(kControllerAddrEnv);
  const char* endpoint = std::getenv("HF_WORKER_ENDPOINT");
  LaunchEnv env;
  env.rank = rank;
  env.world_size = world;
  if (controller != nullptr && *controller != '\0' && std::string(controller) != "0.0.0.0")
    env.master_addr = controller;
  else if (endpoint != nullptr && *endpoint != '\0')
    env.master_addr = endpoint_host(endpoint);
  else
    env.master_addr = rendezvous.value("store_host", std::string("127.0.0.1"));
  env.master_port = rendezvous.at("store_port").get<int>();
  // Collectives move tensors where the model lives: Gloo on the CPU, NCCL on CUDA devices.
  ProcessGroupOptions options;
  options.device = device.is_cuda() ? "cuda" : "cpu";
  options.rank0_hosts_store = false;
  options.gloo_hostname = local_address_towards(env.master_addr);
  // Ranks reach a collective within one call of each other; a dead peer fails the pool through heartbeats.
  options.timeout = std::chrono::seconds(rendezvous.value("timeout_s", 300));
  return ProcessGroup::create_world(env, options);
}

std::unique_ptr<RoleProcessGroups> RoleProcessGroups::connect(const WorkerContext& context, torch::Device device) {
  const MeshCoord& coord = context.coord;
  const int world = coord.world_size;
  HF_CHECK(world > 1, "role '", context.role, "' has one process: it has no process group to join");
  HF_CHECK(context.config.contains(kProcessGroupKey), "role '", context.role, "' has ", world,
           " processes but its config has no '", kProcessGroupKey,
           "' rendezvous; create it through WorkerGroup, which hosts the store");
  const auto& pg = context.config.at(kProcessGroupKey);
  HF_CHECK(pg.value("world_size", world) == world, "role '", context.role, "': '", kProcessGroupKey,
           "' says world_size ", pg.value("world_size", world), " but the rank's coordinates say ", world);
  std::unique_ptr<RoleProcessGroups> groups(new RoleProcessGroups());
  groups->world_ = join_controller_store_group(pg, coord.rank, world, device);
  const DeviceMesh mesh(coord.pp_size, coord.dp_size, coord.tp_size);
  groups->dp_ = coord.dp_size == world ? groups->world_ : groups->world_.split(mesh.dp_groups());
  if (coord.tp_size > 1) groups->tp_ = std::make_unique<Communicator>(groups->world_.split(mesh.tp_groups()));
  if (coord.pp_size > 1) groups->pp_ = std::make_unique<Communicator>(groups->world_.split(mesh.pp_groups()));
  groups->stage_ = PipelineStage{coord.pp, coord.pp_size};
  return groups;
}

std::shared_ptr<PipelineStageRunner> RoleProcessGroups::pipeline_runner(const CausalLM& model) const {
  if (!pp_) return nullptr;
  return std::make_shared<PipelineStageRunner>(model, *pp_);
}

torch::Tensor forward_micro_batches(PipelineStageRunner* pipeline, const DataProto& batch, const MicroBatching& how,
                                    const std::function<torch::Tensor(const DataProto&)>& last_stage) {
  const std::vector<MicroBatch> micro_batches = split_micro_batches(batch, how);
  std::vector<torch::Tensor> parts;
  if (pipeline != nullptr) {
    std::vector<DataProto> data;
    for (const MicroBatch& m : micro_batches) data.push_back(m.data);
    parts = pipeline_forward(*pipeline, data, last_stage);
  } else {
    for (const MicroBatch& m : micro_batches) parts.push_back(last_stage(m.data));
  }
  // Rows back in batch order, trimmed results padded back to the batch's width.
  return merge_micro_results(micro_batches, parts, result_width(batch));
}

void use_model_split(TrainEngine& engine, const CausalLM& model) {
  const TensorParallelGroup& tp = model->tensor_parallel();
  if (!tp.enabled()) return;
  // Experts folded over exactly the tensor-parallel ranks are that group's split too: each rank holds its own,
  // trained on the replica's tokens, so their squares add up over it and data parallelism averages them.
  engine.set_tensor_parallel(tp, [config = model->config(), size = tp.size(),
                                  experts = model->experts_follow_tensor_parallel()](const std::string& name) {
    return shard_dim(name, config, size) != ShardDim::kReplicated || (experts && is_expert_parameter_name(name));
  });
}

void use_model_layout(TrainEngine& engine, const CausalLM& model, std::shared_ptr<PipelineStageRunner> pipeline) {
  use_model_split(engine, model);
  if (pipeline) engine.set_pipeline(std::move(pipeline));
}

const char* batch_protocol(const MeshCoord& coord) {
  return coord.tp_size == 1 && coord.pp_size == 1 ? protocols::kDataParallel : protocols::k3D;
}

const char* rollout_protocol(const MeshCoord& coord) {
  // DP_PROTO hands chunk r to rank r, which is generation replica r only without tensor and pipeline
  // parallelism; otherwise a replica's number (which seeds its sampling) need not be its rank.
  return coord.tp_size == 1 && coord.pp_size == 1 ? protocols::kDataParallel : protocols::k3DAllMicroDP;
}

}  // namespace hybridflow
