// Memory of a worker process as the trainer logs it per pool (memory_stats, every worker type), and how a
// colocated role hands memory back between its calls (verl's fsdp_config.param_offload and
// optimizer_offload): weights and optimizer state go to host memory after a call and come back before the
// next. On a CPU worker both already live in host memory: offloading is a no-op, said once in the log.
#pragma once

#include <torch/torch.h>

#include <nlohmann/json.hpp>
#include <string>

#include "hybridflow/core/data_proto.h"
#include "hybridflow/engine/train_engine.h"

namespace hybridflow {

// This process's memory (core/process_memory.h) as one row of int64 tensors: peak_rss_bytes, rss_bytes,
// cuda_peak_bytes, cuda_allocated_bytes (-1 without CUDA).
DataProto memory_stats_row();

class RoleOffload {
 public:
  RoleOffload() = default;
  // The role's param_offload and optimizer_offload (its TrainSpec); `device`: where it computes.
  RoleOffload(bool params, bool optimizer, torch::Device device, const std::string& role);

  bool params() const { return params_; }
  bool optimizer() const { return optimizer_; }
  // Weights (and buffers) to the compute device before a call that reads them; to host memory after it.
  void load_params(torch::nn::Module& module) const;
  void offload_params(torch::nn::Module& module) const;
  // The optimizer state to the compute device before an update; to host memory after it.
  void load_optimizer(TrainEngine& engine) const;
  void offload_optimizer(TrainEngine& engine) const;

 private:
  bool active() const { return device_.is_cuda(); }
  bool params_ = false, optimizer_ = false;
  torch::Device device_{torch::kCPU};
};

// A method's scope in which the role's weights are on its compute device (param_offload):
//   DataProto Worker::method(const DataProto& in) { ParamsOnDevice on(offload_, *model_); ... }
class ParamsOnDevice {
 public:
  ParamsOnDevice(const RoleOffload& offload, torch::nn::Module& module);
  ~ParamsOnDevice();  // back to host memory; a failure there is logged, not thrown
  ParamsOnDevice(const ParamsOnDevice&) = delete;
  ParamsOnDevice& operator=(const ParamsOnDevice&) = delete;

 private:
  const RoleOffload& offload_;
  torch::nn::Module& module_;
};

}  // namespace hybridflow
