#include "hybridflow/runtime/worker.h"

#include <torch/cuda.h>

#include <cstdlib>

#include "hybridflow/core/error.h"
#include "hybridflow/runtime/protocol.h"

namespace hybridflow {
namespace {
template <typename Map>
std::string key_list(const Map& map) {
  std::string out;
  for (const auto& kv : map) out += (out.empty() ? "" : ", ") + kv.first;
  return out.empty() ? "(none)" : out;
}
}  // namespace

void MethodTable::add(const std::string& name, const std::string& protocol, Fn fn) {
  HF_CHECK(ProtocolRegistry::instance().has(protocol), "worker method '", name, "': unknown transfer protocol '",
           protocol, "'");
  HF_CHECK(entries_.emplace(name, Entry{protocol, std::move(fn)}).second, "worker method '", name,
           "' registered twice");
}

const MethodTable::Entry& MethodTable::get(const std::string& name) const {
  auto it = entries_.find(name);
  HF_CHECK(it != entries_.end(), "worker has no method '", name, "'; registered: ", key_list(entries_));
  return it->second;
}

WorkerRegistry& WorkerRegistry::instance() {
  static WorkerRegistry registry;
  return registry;
}

void WorkerRegistry::add(const std::string& type_name, Factory factory) {
  HF_CHECK(factories_.emplace(type_name, std::move(factory)).second, "worker type '", type_name,
           "' registered twice");
}

bool WorkerRegistry::has(const std::string& type_name) const { return factories_.count(type_name) > 0; }

std::unique_ptr<Worker> WorkerRegistry::create(const std::string& type_name) const {
  auto it = factories_.find(type_name);
  HF_CHECK(it != factories_.end(), "unknown worker type '", type_name,
           "' (register it with HF_REGISTER_WORKER in the worker binary); registered: ", key_list(factories_));
  return it->second();
}

std::map<std::string, std::string> WorkerHost::create(const std::string& type_name, const WorkerContext& context) {
  HF_CHECK(!roles_.count(context.role), "role '", context.role, "' already exists in this worker process");
  Hosted hosted;
  hosted.worker = WorkerRegistry::instance().create(type_name);
  hosted.worker->context_ = context;
  hosted.worker->register_methods(hosted.methods);
  std::map<std::string, std::string> protocols;
  for (const auto& kv : hosted.methods.entries()) protocols[kv.first] = kv.second.protocol;
  HF_CHECK(!protocols.count(kProfileMethod), "worker type '", type_name, "' registers '", kProfileMethod,
           "', a name every worker process answers itself");
  protocols[kProfileMethod] = protocols::kOneToAll;
  roles_.emplace(context.role, std::move(hosted));
  return protocols;
}

DataProto WorkerHost::call(const std::string& role, const std::string& method, const DataProto& input) {
  auto it = roles_.find(role);
  HF_CHECK(it != roles_.end(), "no role '", role, "' in this worker process; hosted: ", key_list(roles_));
  Hosted& hosted = it->second;
  if (method == kProfileMethod) {
    const nlohmann::json request = input.meta().value("profile", nlohmann::json());
    hosted.profiler.arm(request.is_null() ? std::nullopt : std::optional(CallProfileRequest::from_json(request)), role,
                        hosted.worker->rank(), hosted.worker->device());
    return DataProto();
  }
  const auto& fn = hosted.methods.get(method).fn;
  const torch::Device& device = hosted.worker->device();
  return hosted.profiler.run(role, hosted.worker->rank(), method, device, [&] {
    if (device.is_cpu()) return fn(input);
    return fn(input.to(device)).to(torch::kCPU);
  });
}

torch::Device worker_device(const std::string& name) {
  if (name == "cpu") return torch::kCPU;
  HF_CHECK(name == "cuda", "device must be cpu or cuda, got '", name, "'");
  const auto count = static_cast<int64_t>(torch::cuda::device_count());
  HF_CHECK(count > 0, "device 'cuda' asked for, but no CUDA device is visible to this process",
           torch::cuda::is_available() ? "" : " (this build or machine has no CUDA: use trainer.device=cpu, or build "
                                              "with HF_CUDA=1 on a machine with a GPU)");
  // torchrun's variable (also what the controller gives processes it spawns), then mpirun's and srun's.
  int64_t local_rank = 0;
  for (const char* var : {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"}) {
    if (const char* value = std::getenv(var)) {
      local_rank = std::atoll(value);
      break;
    }
  }
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(local_rank % count));
}

}  // namespace hybridflow
