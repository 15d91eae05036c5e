#include "hybridflow/runtime/worker_group.h"

#include "hybridflow/core/error.h"
#include "hybridflow/parallel/store_server.h"
#include "hybridflow/runtime/protocol.h"
#include "coord_json.h"
#include "data_plane.h"

namespace hybridflow {

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
  std::vector<nlohmann::json> coords;
  for (const auto& c : coords_) coords.push_back(runtime_detail::coord_to_json(c));
  methods_ = pool_->create_role(role, worker_type, coords, worker_config);
}

void WorkerGroup::start_call(const std::string& method, const DataProto* value, std::shared_ptr<const CallResult> from,
                             std::shared_ptr<Promise> promise) const {
  try {
    auto it = methods_.find(method);
    if (it == methods_.end()) {
      std::string known;
      for (const auto& kv : methods_) known += (known.empty() ? "" : ", ") + kv.first;
      HF_FAIL("worker group '", role_, "' has no method '", method, "'; registered: ", known);
    }
    const std::string protocol = it->second;
    auto routed = runtime_detail::route_inputs(value, from, protocol, coords_, *pool_);
    const bool keep = pool_->keeps_outputs() && ProtocolRegistry::instance().get(protocol).moves_rows;
    const auto submitted = CallTimeline::Clock::now();
    // The pool is held weakly: these run on its own I/O thread, which must not end up owning it.
    std::weak_ptr<ProcessPool> pool = pool_;
    pool_->submit(
        role_, method, std::move(routed.inputs), keep,
        [promise, protocol, coords = coords_, timeline = timeline_, pool, pool_name = pool_->spec().name, role = role_,
         method, submitted, holds = routed.holds](std::vector<ProcessPool::RankOutput>&& outputs) {
          if (timeline) timeline->call_finished(pool_name, role, method, submitted);
          auto owner = pool.lock();
          HF_CHECK(owner, "resource pool '", pool_name, "' is gone");
          // A throw (collect's checks) goes to the error path.
          promise->set_value(runtime_detail::call_result(owner, role, method, protocol, coords, std::move(outputs)));
        },
        [promise, holds = routed.holds](std::exception_ptr e) { promise->set_exception(e); });
  } catch (...) {
    promise->set_exception(std::current_exception());
  }
}

Future WorkerGroup::call(const std::string& method, const DataProto& input) {
  auto promise = std::make_shared<Promise>();
  Future out = promise->future();
  start_call(method, &input, nullptr, promise);
  return out;
}

Future WorkerGroup::call(const std::string& method, const Future& input) {
  HF_CHECK(input.valid(), "worker group '", role_, "': call '", method, "' got an empty Future as input");
  auto promise = std::make_shared<Promise>();
  Future out = promise->future();
  auto launch = [self = *this, method, input, promise] {
    try {
      self.start_call(method, nullptr, input.result(), promise);  // kept rows are not fetched here
    } catch (...) {
      promise->set_exception(std::current_exception());
    }
  };
  if (input.is_ready()) {
    launch();
  } else {
    // Resolved on another pool's I/O thread: the call starts on a helper thread of this pool, since
    // routing its input may wait for that very pool (rows the controller passes through).
    input.on_ready([pool = pool_, launch, promise, role = role_, method] {
      if (!pool->run_on_helper(launch))
        promise->set_exception(std::make_exception_ptr(Error(detail::concat(
            "resource pool '", pool->spec().name, "' cannot run '", role, ".", method, "': it was shut down"))));
    });
  }
  return out;
}

}  // namespace hybridflow
