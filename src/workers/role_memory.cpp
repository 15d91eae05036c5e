#include "hybridflow/workers/role_memory.h"

#include "hybridflow/core/logging.h"
#include "hybridflow/core/process_memory.h"

namespace hybridflow {

namespace {

void move_module(torch::nn::Module& module, const torch::Device& device) {
  torch::NoGradGuard no_grad;
  // Gradients do not follow Module::to; none is needed between calls (the engine zeroes them per step).
  for (auto& p : module.parameters())
    if (p.grad().defined()) p.mutable_grad() = torch::Tensor();
  module.to(device);
}

}  // namespace

DataProto memory_stats_row() {
  const ProcessMemory m = process_memory();
  DataProto out;
  auto one = [](int64_t v) { return torch::full({1}, v, torch::kLong); };
  out.set_tensor("peak_rss_bytes", one(m.peak_rss_bytes));
  out.set_tensor("rss_bytes", one(m.rss_bytes));
  out.set_tensor("cuda_peak_bytes", one(m.cuda_peak_bytes));
  out.set_tensor("cuda_allocated_bytes", one(m.cuda_allocated_bytes));
  return out;
}

RoleOffload::RoleOffload(bool params, bool optimizer, torch::Device device, const std::string& role)
    : params_(params), optimizer_(optimizer), device_(device) {
  if ((params_ || optimizer_) && !device.is_cuda())
    log_info("role '", role, "': ", params_ ? "param_offload" : "", params_ && optimizer_ ? " and " : "",
             optimizer_ ? "optimizer_offload" : "",
             " requested, but this worker computes on the CPU, where weights and optimizer state already live in ",
             "host memory: nothing to offload");
}

void RoleOffload::load_params(torch::nn::Module& module) const {
  if (params_ && active()) move_module(module, device_);
}

void RoleOffload::offload_params(torch::nn::Module& module) const {
  if (!params_ || !active()) return;
  move_module(module, torch::kCPU);
  release_cached_device_memory();
}

void RoleOffload::load_optimizer(TrainEngine& engine) const {
  if (optimizer_ && active()) engine.move_optimizer_state(device_);
}

void RoleOffload::offload_optimizer(TrainEngine& engine) const {
  if (!optimizer_ || !active()) return;
  engine.move_optimizer_state(torch::kCPU);
  release_cached_device_memory();
}

ParamsOnDevice::ParamsOnDevice(const RoleOffload& offload, torch::nn::Module& module)
    : offload_(offload), module_(module) {
  offload_.load_params(module_);
}

ParamsOnDevice::~ParamsOnDevice() {
  try {
    offload_.offload_params(module_);
  } catch (const std::exception& e) {
    log_warn("offloading weights to host memory failed: ", e.what());
  }
}

}  // namespace hybridflow
