// Workers: the code that runs inside a worker process for one role (actor, critic, ...). A worker
// type is registered by name so that a spawned process can construct it; each instance registers its
// callable methods by name with the transfer protocol the controller uses to split/merge their data.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "hybridflow/core/data_proto.h"
#include "hybridflow/runtime/call_profiler.h"
#include "hybridflow/runtime/mesh_coord.h"

namespace hybridflow {

struct WorkerContext {
  std::string role;        // name of the worker group, e.g. "critic"
  std::string pool;        // resource pool the process belongs to
  MeshCoord coord;         // rank, world size and mesh coordinates within the group
  nlohmann::json config = nlohmann::json::object();  // passed from the controller at group creation
};

class MethodTable {
 public:
  using Fn = std::function<DataProto(const DataProto&)>;
  struct Entry {
    std::string protocol;
    Fn fn;
  };

  void add(const std::string& name, const std::string& protocol, Fn fn);  // Error on duplicate/unknown protocol
  template <typename W>
  void add(const std::string& name, const std::string& protocol, W* self, DataProto (W::*method)(const DataProto&)) {
    add(name, protocol, [self, method](const DataProto& in) { return (self->*method)(in); });
  }
  const Entry& get(const std::string& name) const;  // Error naming the registered methods
  const std::map<std::string, Entry>& entries() const { return entries_; }

 private:
  std::map<std::string, Entry> entries_;
};

class Worker {
 public:
  virtual ~Worker() = default;
  // Called once after the context is set; register every method the controller may call.
  virtual void register_methods(MethodTable& table) = 0;

  const WorkerContext& context() const { return context_; }
  int rank() const { return context_.coord.rank; }
  int world_size() const { return context_.coord.world_size; }
  const MeshCoord& coord() const { return context_.coord; }
  // Where this worker's tensors live. WorkerHost moves each call's input here once, before the method
  // runs, and its output back to the CPU after: data between controller and workers stays host-side.
  const torch::Device& device() const { return device_; }

 protected:
  // Called from register_methods by workers that compute on an accelerator.
  void set_device(const torch::Device& device) { device_ = device; }

 private:
  friend class WorkerHost;
  WorkerContext context_;
  torch::Device device_{torch::kCPU};
};

// The device a worker process should use for config value `name` ("cpu" or "cuda"): CUDA device
// LOCAL_RANK (torchrun's, or the one the controller gave the process; else OMPI_COMM_WORLD_LOCAL_RANK or
// SLURM_LOCALID) modulo the visible devices.
// Error when CUDA is asked for and no device is visible, or the value is neither.
torch::Device worker_device(const std::string& name);

class WorkerRegistry {
 public:
  using Factory = std::function<std::unique_ptr<Worker>()>;
  static WorkerRegistry& instance();
  void add(const std::string& type_name, Factory factory);  // Error on a duplicate name
  template <typename W>
  void add(const std::string& type_name) {
    add(type_name, [] { return std::unique_ptr<Worker>(new W()); });
  }
  std::unique_ptr<Worker> create(const std::string& type_name) const;  // Error naming registered types
  bool has(const std::string& type_name) const;

 private:
  std::map<std::string, Factory> factories_;
};

// Everything one worker process hosts: several roles (colocated workers) share the process and run
// one call at a time. Besides a worker's own methods each role answers kProfileMethod (call_profiler.h).
class WorkerHost {
 public:
  // Returns method name -> protocol of the new worker (kProfileMethod included). Error if the role already
  // exists.
  std::map<std::string, std::string> create(const std::string& type_name, const WorkerContext& context);
  DataProto call(const std::string& role, const std::string& method, const DataProto& input);
  bool has_role(const std::string& role) const { return roles_.count(role) > 0; }

 private:
  struct Hosted {
    std::unique_ptr<Worker> worker;
    MethodTable methods;
    CallProfiler profiler;
  };
  std::map<std::string, Hosted> roles_;
};

}  // namespace hybridflow

// Registers worker class `Type` (default-constructible, derived from Worker) under `name` at start-up.
// Use at namespace scope in the worker binary, before run_worker_if_requested() runs.
#define HF_REGISTER_WORKER(Type, name) HF_REGISTER_WORKER_AT(Type, name, __COUNTER__)
#define HF_REGISTER_WORKER_AT(Type, name, n) HF_REGISTER_WORKER_IMPL(Type, name, n)
#define HF_REGISTER_WORKER_IMPL(Type, name, n)                \
  static const bool hf_worker_registered_##n = [] {           \
    ::hybridflow::WorkerRegistry::instance().add<Type>(name); \
    return true;                                              \
  }()
