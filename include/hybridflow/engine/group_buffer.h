// The bounded buffer between a streaming rollout and the trainer: the generator (engine/generation.h,
// GenerationConfig::on_group_finished) pushes each prompt's group of samples as soon as it ends; the trainer
// takes a batch of groups once enough are ready. The producer pauses (push blocks) while the buffer is full,
// and a group is never handed to a trainer more than `staleness` policy versions past the version that began
// it: take() sets such groups aside (counted) for the producer to generate again (take_stale()).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <vector>

#include "hybridflow/engine/generation.h"

namespace hybridflow {

struct BufferedGroup {
  int64_t prompt_id = 0;      // the producer's name for the prompt (its data position), to regenerate it
  int64_t begin_version = 0;  // the policy version that began its oldest sample
  FinishedGroup group;
};

class GroupBuffer {
 public:
  // capacity: the most groups held (>= 1); staleness: k >= 0.
  GroupBuffer(int64_t capacity, int64_t staleness);

  // Producer. Waits while the buffer is full (counted as a pause), then appends; false (nothing appended)
  // once close() was called.
  bool push(BufferedGroup group);
  // Consumer. Waits until `count` groups trainable at `trainer_version` are ready (or close()), and returns
  // them in the order they were pushed. Groups begun before trainer_version - staleness are moved to the
  // stale list first, whenever found. After close(), returns what is ready, possibly fewer than count.
  std::vector<BufferedGroup> take(int64_t count, int64_t trainer_version);
  // The groups take() rejected as too old since the last call (their prompts to be generated again).
  std::vector<BufferedGroup> take_stale();
  // Wakes every waiter; later pushes are refused.
  void close();

  // The groups held now, oldest first (a checkpoint saves them).
  std::vector<BufferedGroup> snapshot() const;
  int64_t size() const;
  int64_t capacity() const { return capacity_; }

  struct Stats {
    int64_t pushed = 0, taken = 0, dropped_stale = 0;
    int64_t pauses = 0;           // pushes that found the buffer full
    double paused_seconds = 0.0;  // the producer's time waiting for room
    int64_t peak = 0;             // most groups held at once
  };
  Stats stats() const;

 private:
  // Moves groups too old for trainer_version to stale_ (under the lock).
  void reject_stale(int64_t trainer_version);

  const int64_t capacity_, staleness_;
  mutable std::mutex mutex_;
  std::condition_variable room_, ready_;
  std::deque<BufferedGroup> groups_;
  std::vector<BufferedGroup> stale_;
  bool closed_ = false;
  Stats stats_;
};

}  // namespace hybridflow
