#include "object_table.h"

#include <torch/torch.h>

#include "hybridflow/core/error.h"

namespace hybridflow::transport_detail {

void ObjectTable::set_capacity(int64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  capacity_ = bytes;
}

bool ObjectTable::put(int64_t id, std::map<std::string, torch::Tensor> tensors) {
  Entry e;
  for (auto& [key, t] : tensors) {
    HF_CHECK(t.device().is_cpu() && t.is_contiguous(), "object table: tensor '", key, "' must be CPU and contiguous");
    e.bytes += static_cast<int64_t>(t.numel()) * static_cast<int64_t>(t.element_size());
    const int64_t version = t._version();
    e.tensors.emplace(key, std::make_pair(std::move(t), version));
  }
  std::lock_guard<std::mutex> lock(mutex_);
  HF_CHECK(!entries_.count(id), "object table: object ", id, " is already held");
  if (bytes_ + e.bytes > capacity_) return false;
  bytes_ += e.bytes;
  entries_.emplace(id, std::move(e));
  return true;
}

const ObjectTable::Entry& ObjectTable::entry(int64_t id) const {
  auto it = entries_.find(id);
  HF_CHECK(it != entries_.end(), "object ", id, " is not held by this worker (released after the controller dropped ",
           "its last handle, or never kept)");
  return it->second;
}

torch::Tensor ObjectTable::checked(int64_t id, const Entry& e, const std::string& key) const {
  auto it = e.tensors.find(key);
  if (it == e.tensors.end()) {
    std::string known;
    for (const auto& kv : e.tensors) known += (known.empty() ? "" : ", ") + kv.first;
    HF_FAIL("object ", id, " holds no tensor '", key, "'; it holds: ", known);
  }
  const auto& [t, version] = it->second;
  HF_CHECK(t._version() == version, "tensor '", key, "' of object ", id, " was modified in place after it was kept ",
           "(by the method that returned it, or by a method that read it in this process); methods must not write ",
           "into their inputs or into outputs they returned: clone() first");
  return t;
}

torch::Tensor ObjectTable::get(int64_t id, const std::string& key) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return checked(id, entry(id), key);
}

std::vector<std::pair<std::string, std::vector<torch::Tensor>>> ObjectTable::row_views(
    int64_t id, const std::vector<std::string>& keys, const RowRuns& runs) const {
  std::vector<std::pair<std::string, std::vector<torch::Tensor>>> out;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const Entry& e = entry(id);
    for (const auto& key : keys) out.emplace_back(key, std::vector<torch::Tensor>{checked(id, e, key)});
  }
  for (auto& [key, views] : out) {
    HF_CHECK(!runs.empty(), "object ", id, ": no rows asked for");
    const torch::Tensor t = views.front();
    views.clear();
    for (const auto& [start, count] : runs) {
      HF_CHECK(start >= 0 && count >= 0 && start + count <= t.size(0), "object ", id, ": rows [", start, ", ",
               start + count, ") of tensor '", key, "' are outside its ", t.size(0), " rows");
      views.push_back(t.narrow(0, start, count));
    }
  }
  return out;
}

DataProto ObjectTable::rows(int64_t id, const std::vector<std::string>& keys, const RowRuns& runs) const {
  DataProto out;
  for (auto& [key, views] : row_views(id, keys, runs))
    out.set_tensor(key, views.size() == 1 ? views.front() : torch::cat(views, 0));
  return out;
}

void ObjectTable::release(int64_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return;
  bytes_ -= it->second.bytes;
  entries_.erase(it);
}

int64_t ObjectTable::objects() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(entries_.size());
}

int64_t ObjectTable::bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return bytes_;
}

}  // namespace hybridflow::transport_detail
