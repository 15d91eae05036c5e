#include "hybridflow/runtime/worker_group.h"

#include "hybridflow/core/error.h"
#include "hybridflow/parallel/store_server.h"
#include "hybridflow/runtime/protocol.h"

namespace hybridflow {

using ResultPromise = std::promise<std::shared_ptr<const CallResult>>;

WorkerGroup::WorkerGroup(std::shared_ptr<ProcessPool> pool, const std::string& role, const std::string& worker_type,
                         const ParallelLayout& layout, const nlohmann::json& config)
    : pool_(std::move(pool)), role_(role) {
  HF_CHECK(pool_, "worker group '", role, "': no resource pool");
  coords_ = mesh_coords(pool_->size(), layout);
  nlohmann::json worker_config = config;
  if (pool_->size() > 1 && (worker_config.is_object() || worker_config.is_null())) {
    HF_CHECK(!worker_config.contains(kProcessGroupKey), "worker group '", role, "': config key '",
             kProcessGroupKey, "' is reserved for the group's own rendezvous");
    // The store listens where the pool does: loopback on one machine, the launch's address on several.
    store_ = StoreServer::start(0, std::chrono::seconds(60), pool_->spec().bind_host);
    worker_config[kProcessGroupKey] = {{"store_port", store_->port()}, {"world_size", pool_->size()}};
  }
  methods_ = pool_->create_role(role, worker_type, coords_, worker_config);
}

void WorkerGroup::start_call(const std::string& method, const DataProto& input,
                             std::shared_ptr<ResultPromise> promise) const {
  try {
    auto it = methods_.find(method);
    if (it == methods_.end()) {
      std::string known;
      for (const auto& kv : methods_) known += (known.empty() ? "" : ", ") + kv.first;
      HF_FAIL("worker group '", role_, "' has no method '", method, "'; registered: ", known);
    }
    const std::string protocol = it->second;
    auto inputs = dispatch_input(protocol, input, coords_);
    auto coords = coords_;
    const auto submitted = CallTimeline::Clock::now();
    pool_->submit(
        role_, method, std::move(inputs),
        [promise, protocol, coords, timeline = timeline_, pool = pool_->spec().name, role = role_, method,
         submitted](std::vector<DataProto>&& outputs) {
          if (timeline) timeline->call_finished(pool, role, method, submitted);
          auto result = std::make_shared<CallResult>();
          result->merged = collect_outputs(protocol, outputs, coords);  // a throw goes to the error path
          result->per_rank = std::move(outputs);
          promise->set_value(std::move(result));
        },
        [promise](std::exception_ptr e) { promise->set_exception(e); });
  } catch (...) {
    promise->set_exception(std::current_exception());
  }
}

Future WorkerGroup::call(const std::string& method, const DataProto& input) {
  auto promise = std::make_shared<ResultPromise>();
  Future out(promise->get_future().share());
  start_call(method, input, promise);
  return out;
}

Future WorkerGroup::call(const std::string& method, const Future& input) {
  HF_CHECK(input.valid(), "worker group '", role_, "': call '", method, "' got an empty Future as input");
  auto promise = std::make_shared<ResultPromise>();
  Future out(promise->get_future().share());
  auto launch = [self = *this, method, input, promise] {
    try {
      const DataProto& value = input.get();
      self.start_call(method, value, promise);
    } catch (...) {
      promise->set_exception(std::current_exception());
    }
  };
  if (input.is_ready())
    launch();
  else
    pool_->when_ready(input, launch);
  return out;
}

}  // namespace hybridflow
