#include "hybridflow/runtime/call_timeline.h"

#include <algorithm>

namespace hybridflow {

void CallTimeline::call_finished(const std::string& pool, const std::string& role, const std::string& method,
                                 Clock::time_point submitted) {
  const auto now = Clock::now();
  std::lock_guard<std::mutex> lock(mutex_);
  auto [free_at, first] = pool_free_at_.emplace(pool, submitted);
  const auto start = first ? submitted : std::max(submitted, free_at->second);
  free_at->second = now;
  spans_.push_back({pool, role, method, std::min(start, now), now});
}

void CallTimeline::add(CallSpan span) {
  std::lock_guard<std::mutex> lock(mutex_);
  spans_.push_back(std::move(span));
}

std::vector<CallSpan> CallTimeline::take() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<CallSpan> out;
  out.swap(spans_);
  return out;
}

}  // namespace hybridflow
