// Seconds on the monotonic clock, for timing a piece of work (differences only: the origin is arbitrary).
#pragma once

#include <chrono>

namespace hybridflow {

inline double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace hybridflow
