#include "hybridflow/runtime/future.h"

#include <chrono>
#include <exception>

#include "data_plane.h"
#include "hybridflow/core/error.h"
#include "hybridflow/core/logging.h"

namespace hybridflow {

CallResult::CallResult(DataProto merged, std::vector<DataProto> per_rank)
    : merged_(std::move(merged)), per_rank_(std::move(per_rank)) {}

CallResult::CallResult(std::shared_ptr<const RemoteResult> remote) : remote_(std::move(remote)) {}

const DataProto& CallResult::merged() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!merged_) {
    std::vector<std::string> missing;
    for (const auto& kv : remote_->kept)
      if (!fetched_.count(kv.first)) missing.push_back(kv.first);
    for (auto& [key, t] : runtime_detail::materialize(*remote_, missing)) fetched_[key] = std::move(t);
    DataProto out = runtime_detail::visible_skeleton(*remote_);
    for (const auto& [key, t] : fetched_) out.set_tensor(key, t);
    merged_ = std::move(out);
    fetched_.clear();
  }
  return *merged_;
}

DataProto CallResult::merged(const std::vector<std::string>& tensor_keys) const {
  std::vector<std::string> fields;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!merged_) {
      DataProto out = runtime_detail::visible_skeleton(*remote_);
      std::vector<std::string> missing;
      for (const auto& key : tensor_keys)
        if (remote_->kept.count(key) && !fetched_.count(key)) missing.push_back(key);
      for (auto& [key, t] : runtime_detail::materialize(*remote_, missing)) fetched_[key] = std::move(t);
      for (const auto& key : tensor_keys)
        if (fetched_.count(key)) out.set_tensor(key, fetched_.at(key));
      for (const auto& kv : out.fields()) fields.push_back(kv.first);
      // An unknown key is an Error naming the available ones, kept ones included.
      for (const auto& key : tensor_keys)
        HF_CHECK(out.has_tensor(key), "the result has no tensor '", key, "'; it has: ",
                 runtime_detail::tensor_names(*remote_));
      return out.select(tensor_keys, fields);
    }
  }
  for (const auto& kv : merged_->fields()) fields.push_back(kv.first);
  return merged_->select(tensor_keys, fields);
}

const std::vector<DataProto>& CallResult::per_rank() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!per_rank_) per_rank_ = runtime_detail::materialize_per_rank(*remote_);
  return *per_rank_;
}

struct Future::State {
  std::promise<std::shared_ptr<const CallResult>> promise;
  std::shared_future<std::shared_ptr<const CallResult>> future = promise.get_future().share();
  std::mutex mutex;
  bool resolved = false;
  std::vector<std::function<void()>> callbacks;

  void run_callbacks() {
    std::vector<std::function<void()>> ready;
    {
      std::lock_guard<std::mutex> lock(mutex);
      resolved = true;
      ready.swap(callbacks);
    }
    // A callback's failure must not reach the resolver, which may not resolve twice.
    for (auto& fn : ready) {
      try {
        fn();
      } catch (const std::exception& e) {
        log_error("a callback of a resolved call failed: ", e.what());
      }
    }
  }
};

Promise::Promise() : state_(std::make_shared<Future::State>()) {}

void Promise::set_value(std::shared_ptr<const CallResult> result) {
  state_->promise.set_value(std::move(result));
  state_->run_callbacks();
}

void Promise::set_exception(std::exception_ptr error) {
  state_->promise.set_exception(std::move(error));
  state_->run_callbacks();
}

const std::shared_future<std::shared_ptr<const CallResult>>& Future::shared() const {
  HF_CHECK(state_ != nullptr, "an empty Future (default-constructed) has no result");
  return state_->future;
}

void Future::on_ready(std::function<void()> fn) const {
  shared();  // an empty Future is an Error
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    if (!state_->resolved) {
      state_->callbacks.push_back(std::move(fn));
      return;
    }
  }
  fn();
}

Future Future::ready(DataProto value) {
  Promise p;
  p.set_value(std::make_shared<CallResult>(std::move(value), std::vector<DataProto>{}));
  return p.future();
}

bool Future::is_ready() const { return wait_for(0); }

bool Future::wait_for(double seconds) const {
  return shared().wait_for(std::chrono::duration<double>(seconds)) == std::future_status::ready;
}

void wait_all(const std::vector<Future>& futures) {
  std::exception_ptr first;
  for (const auto& f : futures) {
    try {
      f.result();  // resolved or failed; kept tensors stay where they are
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

}  // namespace hybridflow
