#include "hybridflow/engine/group_buffer.h"

#include <algorithm>

#include "hybridflow/core/error.h"

namespace hybridflow {

GroupBuffer::GroupBuffer(int64_t capacity, int64_t staleness) : capacity_(capacity), staleness_(staleness) {
  HF_CHECK(capacity >= 1, "GroupBuffer: capacity must be at least 1 group, got ", capacity);
  HF_CHECK(staleness >= 0, "GroupBuffer: staleness must be >= 0, got ", staleness);
}

bool GroupBuffer::push(BufferedGroup group) {
  std::unique_lock lock(mutex_);
  if (!closed_ && static_cast<int64_t>(groups_.size()) >= capacity_) {
    ++stats_.pauses;
    const auto start = std::chrono::steady_clock::now();
    room_.wait(lock, [this] { return closed_ || static_cast<int64_t>(groups_.size()) < capacity_; });
    stats_.paused_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  if (closed_) return false;
  groups_.push_back(std::move(group));
  ++stats_.pushed;
  stats_.peak = std::max(stats_.peak, static_cast<int64_t>(groups_.size()));
  ready_.notify_all();
  return true;
}

void GroupBuffer::reject_stale(int64_t trainer_version) {
  const auto before = groups_.size();
  for (auto it = groups_.begin(); it != groups_.end();) {
    if (it->begin_version + staleness_ < trainer_version) {
      stale_.push_back(std::move(*it));
      it = groups_.erase(it);
      ++stats_.dropped_stale;
    } else {
      ++it;
    }
  }
  if (groups_.size() != before) room_.notify_all();  // the producer may go on
}

std::vector<BufferedGroup> GroupBuffer::take(int64_t count, int64_t trainer_version) {
  HF_CHECK(count >= 1 && count <= capacity_, "GroupBuffer::take: ", count, " groups from a buffer of ", capacity_,
           " (a batch must fit in the buffer)");
  std::unique_lock lock(mutex_);
  ready_.wait(lock, [&] {
    reject_stale(trainer_version);
    return closed_ || static_cast<int64_t>(groups_.size()) >= count;
  });
  const auto n = std::min<size_t>(groups_.size(), static_cast<size_t>(count));
  std::vector<BufferedGroup> out;
  for (size_t i = 0; i < n; ++i) {
    out.push_back(std::move(groups_.front()));
    groups_.pop_front();
  }
  stats_.taken += static_cast<int64_t>(n);
  room_.notify_all();
  return out;
}

std::vector<BufferedGroup> GroupBuffer::take_stale() {
  std::lock_guard lock(mutex_);
  std::vector<BufferedGroup> out = std::move(stale_);
  stale_.clear();
  return out;
}

void GroupBuffer::close() {
  std::lock_guard lock(mutex_);
  closed_ = true;
  room_.notify_all();
  ready_.notify_all();
}

std::vector<BufferedGroup> GroupBuffer::snapshot() const {
  std::lock_guard lock(mutex_);
  return {groups_.begin(), groups_.end()};
}

int64_t GroupBuffer::size() const {
  std::lock_guard lock(mutex_);
  return static_cast<int64_t>(groups_.size());
}

GroupBuffer::Stats GroupBuffer::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

}  // namespace hybridflow
