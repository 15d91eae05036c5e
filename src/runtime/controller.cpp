#include "hybridflow/runtime/controller.h"

#include <future>
#include <set>

#include "hybridflow/core/error.h"
#include "transport/launcher_detail.h"
#include "transport/message.h"

namespace hybridflow {

Controller::~Controller() { shutdown(); }

ResourcePool Controller::with_data_token(ResourcePool spec) {
  // Workers started elsewhere know only the secret they were given: they keep the pool's own.
  if (spec.data_token.empty() && spec.spawn_workers) {
    if (data_secret_.empty()) data_secret_ = transport_detail::random_secret();
    spec.data_token = data_secret_;
  }
  return spec;
}

std::shared_ptr<ProcessPool> Controller::add_pool(const ResourcePool& spec) {
  HF_CHECK(!pools_.count(spec.name), "resource pool '", spec.name, "' already exists");
  auto pool = ProcessPool::start(with_data_token(spec));
  pools_[spec.name] = pool;
  return pool;
}

std::vector<std::shared_ptr<ProcessPool>> Controller::add_pools(const std::vector<ResourcePool>& specs) {
  std::set<std::string> names;
  for (const auto& spec : specs)
    HF_CHECK(!pools_.count(spec.name) && names.insert(spec.name).second, "resource pool '", spec.name,
             "' already exists");
  // Launcher ranks go to pools in the order given, not in the order their concurrent starts get there.
  if (auto* launch = transport_detail::launch_rendezvous()) {
    std::vector<std::pair<std::string, int>> sizes;
    for (const auto& spec : specs)
      if (spec.spawn_workers) sizes.emplace_back(spec.name, spec.num_processes);
    launch->reserve(sizes);
  }
  std::vector<std::future<std::shared_ptr<ProcessPool>>> starting;
  for (const auto& spec : specs)
    starting.push_back(std::async(std::launch::async, ProcessPool::start, with_data_token(spec)));
  std::vector<std::shared_ptr<ProcessPool>> started;
  std::exception_ptr first;
  for (auto& f : starting) {
    try {
      started.push_back(f.get());
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) {
    for (auto& pool : started) pool->shutdown();
    std::rethrow_exception(first);
  }
  for (auto& pool : started) pools_[pool->spec().name] = pool;
  return started;
}

std::shared_ptr<ProcessPool> Controller::pool(const std::string& name) const {
  auto it = pools_.find(name);
  if (it == pools_.end()) {
    std::string known;
    for (const auto& kv : pools_) known += (known.empty() ? "" : ", ") + kv.first;
    HF_FAIL("no resource pool named '", name, "'; pools: ", known.empty() ? "(none)" : known);
  }
  return it->second;
}

WorkerGroup Controller::create_group(const std::string& pool_name, const std::string& role,
                                     const std::string& worker_type, const ParallelLayout& layout,
                                     const nlohmann::json& config) {
  return WorkerGroup(pool(pool_name), role, worker_type, layout, config);
}

std::shared_ptr<ProcessPool> Controller::restart_pool(const std::string& name) {
  std::shared_ptr<ProcessPool> old = pool(name);
  const ResourcePool spec = old->spec();  // with the data token the job's other pools share
  HF_CHECK(spec.spawn_workers && transport_detail::launch_rendezvous() == nullptr, "resource pool '", name,
           "': its workers were started by a launcher (torchrun, mpirun, srun) or by hand, so the controller cannot ",
           "start them again");
  old->shutdown();
  retired_ += old->traffic();
  pools_.erase(name);
  auto fresh = ProcessPool::start(spec);
  pools_[name] = fresh;
  return fresh;
}

void Controller::shutdown() {
  // Stop all first so that chained calls waiting on another pool's result resolve (with an error)
  // before any pool joins its helper threads.
  for (auto& kv : pools_) kv.second->stop();
  for (auto& kv : pools_) kv.second->shutdown();
  for (auto& kv : pools_) retired_ += kv.second->traffic();
  pools_.clear();
}

Traffic Controller::total_traffic() const {
  Traffic total = retired_;
  for (const auto& kv : pools_) total += kv.second->traffic();
  return total;
}

Traffic Controller::take_traffic() {
  const Traffic now = total_traffic();
  const Traffic delta = now - taken_;
  taken_ = now;
  return delta;
}

}  // namespace hybridflow
