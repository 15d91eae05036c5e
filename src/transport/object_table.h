// The outputs a worker process keeps for the data plane (runtime/data_plane.h): one object per call (its
// id is the pool's call id), tensors by key. Consumers in this process read them without copying; other
// processes fetch rows of them over the data socket (data_server.h); the controller releases an object
// when its last handle to it goes. Bounded: an output that would take the table past its capacity is not
// kept (the call answers with it, as without the data plane). Thread-safe: the executor keeps and reads,
// the I/O thread serves and releases.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "hybridflow/core/data_proto.h"

namespace hybridflow::transport_detail {

// [start, count] row ranges of an object, in the order they are wanted.
using RowRuns = std::vector<std::pair<int64_t, int64_t>>;

class ObjectTable {
 public:
  void set_capacity(int64_t bytes);
  // Keeps `tensors` (CPU, contiguous) as object `id`. False, keeping nothing, when they do not fit.
  bool put(int64_t id, std::map<std::string, torch::Tensor> tensors);
  // Tensor `key` of object `id`, shared (not copied). Error when the object or key is not held, or when
  // someone wrote into the tensor after it was kept (every reader would see other bytes than the first).
  torch::Tensor get(int64_t id, const std::string& key) const;
  // Rows `runs` of each of `keys`, concatenated in run order (a single run is a view, not a copy).
  DataProto rows(int64_t id, const std::vector<std::string>& keys, const RowRuns& runs) const;
  // The same rows uncopied: for each key (in `keys` order), one view per run.
  std::vector<std::pair<std::string, std::vector<torch::Tensor>>> row_views(int64_t id, const std::vector<std::string>& keys,
                                                                            const RowRuns& runs) const;
  void release(int64_t id);
  int64_t objects() const;
  int64_t bytes() const;

 private:
  struct Entry {
    std::map<std::string, std::pair<torch::Tensor, int64_t>> tensors;  // with its version when kept
    int64_t bytes = 0;
  };
  const Entry& entry(int64_t id) const;  // caller holds mutex_
  torch::Tensor checked(int64_t id, const Entry& e, const std::string& key) const;

  mutable std::mutex mutex_;
  std::map<int64_t, Entry> entries_;
  int64_t bytes_ = 0;
  int64_t capacity_ = 0;
};

}  // namespace hybridflow::transport_detail
