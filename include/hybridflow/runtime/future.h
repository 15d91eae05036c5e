// The result of an asynchronous worker-group call. Copyable; every copy sees the same result. A
// Future can be passed as the input of another call, which is then dispatched when it resolves,
// without the controller waiting.
#pragma once

#include <future>
#include <memory>
#include <vector>

#include "hybridflow/core/data_proto.h"

namespace hybridflow {

struct CallResult {
  DataProto merged;                 // the protocol's collect() of the outputs
  std::vector<DataProto> per_rank;  // every rank's raw output, indexed by rank
};

class Future {
 public:
  Future() = default;
  explicit Future(std::shared_future<std::shared_ptr<const CallResult>> f) : f_(std::move(f)) {}
  static Future ready(DataProto value);  // an already resolved Future

  bool valid() const { return f_.valid(); }
  bool is_ready() const;
  void wait() const { f_.wait(); }
  bool wait_for(double seconds) const;
  const DataProto& get() const { return f_.get()->merged; }  // waits; rethrows the call's Error
  const std::vector<DataProto>& per_rank() const { return f_.get()->per_rank; }

 private:
  std::shared_future<std::shared_ptr<const CallResult>> f_;
};

// Waits for all; rethrows the first failure (in argument order) after all have resolved.
void wait_all(const std::vector<Future>& futures);

}  // namespace hybridflow
