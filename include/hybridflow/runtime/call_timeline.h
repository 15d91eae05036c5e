// When each worker-group call ran, as the controller sees it: one span per call (pool, role, method,
// start, end), for the per-step timeline of a run (trainer: <run_dir>/timeline.jsonl, the report's Gantt
// chart). A WorkerGroup given a CallTimeline records every call it makes into it.
#pragma once

#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace hybridflow {

struct CallSpan {
  using Clock = std::chrono::steady_clock;
  std::string pool, role, method;
  Clock::time_point start, end;
};

// Thread-safe: calls finish on the pools' I/O threads while the controller reads spans.
class CallTimeline {
 public:
  using Clock = CallSpan::Clock;

  // A call submitted to `pool` at `submitted` has just returned. A pool runs its calls one at a time in
  // the order they were sent (colocated roles share its processes), so a call sent while an earlier one
  // was still running started only when that one ended: the span starts at the later of the two.
  void call_finished(const std::string& pool, const std::string& role, const std::string& method,
                     Clock::time_point submitted);
  // A span measured elsewhere (e.g. work the controller does itself between calls).
  void add(CallSpan span);
  // The spans recorded since the last take(), in the order they ended; clears them.
  std::vector<CallSpan> take();

 private:
  std::mutex mutex_;
  std::vector<CallSpan> spans_;
  std::map<std::string, Clock::time_point> pool_free_at_;  // when each pool's last call ended
};

}  // namespace hybridflow
