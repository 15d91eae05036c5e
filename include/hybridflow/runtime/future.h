// The result of an asynchronous worker-group call. Copyable; every copy sees the same result. A
// Future can be passed as the input of another call, which is then dispatched when it resolves,
// without the controller waiting.
//
// With the data plane (ResourcePool::data_plane, docs/ARCHITECTURE.md) a result's bulk tensors may stay
// on the workers that made them: the controller holds a handle and the metadata, another group's call
// given the Future fetches its rows from those workers directly, and get() fetches them to the
// controller only when (and the first time) it is called. get(keys) fetches only those tensors.
#pragma once

#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "hybridflow/core/data_proto.h"

namespace hybridflow {

struct RemoteResult;  // a result whose bulk tensors stayed on the workers (runtime-internal: data_plane.h)

class CallResult {
 public:
  CallResult(DataProto merged, std::vector<DataProto> per_rank);  // held by the controller
  explicit CallResult(std::shared_ptr<const RemoteResult> remote);  // held by the workers
  const DataProto& merged() const;  // the protocol's collect() of the outputs; fetches kept tensors once
  // Only these tensors (every field and the meta too); kept tensors fetched once each.
  DataProto merged(const std::vector<std::string>& tensor_keys) const;
  const std::vector<DataProto>& per_rank() const;  // every rank's raw output, indexed by rank
  const std::shared_ptr<const RemoteResult>& remote() const { return remote_; }  // null: held by the controller

 private:
  std::shared_ptr<const RemoteResult> remote_;
  mutable std::mutex mutex_;
  mutable std::optional<DataProto> merged_;
  mutable std::optional<std::vector<DataProto>> per_rank_;
  mutable std::map<std::string, torch::Tensor> fetched_;  // kept tensors fetched by merged(keys)
};

class Promise;

class Future {
 public:
  Future() = default;
  static Future ready(DataProto value);  // an already resolved Future

  bool valid() const { return state_ != nullptr; }
  bool is_ready() const;
  void wait() const { shared().wait(); }
  bool wait_for(double seconds) const;
  const DataProto& get() const { return shared().get()->merged(); }  // waits; rethrows the call's Error
  DataProto get(const std::vector<std::string>& tensor_keys) const { return shared().get()->merged(tensor_keys); }
  const std::vector<DataProto>& per_rank() const { return shared().get()->per_rank(); }
  // Waits; whether tensors of the result stay on the workers (fetched to the controller only by get()).
  bool held_on_workers() const { return shared().get()->remote() != nullptr; }
  const std::shared_ptr<const CallResult>& result() const { return shared().get(); }  // waits; rethrows

  // Runs fn once the call resolved or failed: at once on this thread if it already has, else on the
  // thread that resolves it (a pool's I/O thread), so fn must be quick and must not wait for a call.
  void on_ready(std::function<void()> fn) const;

  struct State;

 private:
  friend class Promise;
  explicit Future(std::shared_ptr<State> state) : state_(std::move(state)) {}
  const std::shared_future<std::shared_ptr<const CallResult>>& shared() const;
  std::shared_ptr<State> state_;
};

// The producing end of a Future (a worker group's call): resolved once, then the Future's on_ready
// callbacks run on the resolving thread.
class Promise {
 public:
  Promise();
  Future future() const { return Future(state_); }
  void set_value(std::shared_ptr<const CallResult> result);
  void set_exception(std::exception_ptr error);

 private:
  std::shared_ptr<Future::State> state_;
};

// Waits for all; rethrows the first failure (in argument order) after all have resolved.
void wait_all(const std::vector<Future>& futures);

}  // namespace hybridflow
