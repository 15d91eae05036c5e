// The collective bandwidth between processes on this machine, for `hybridflow plan --calibrate`: ranks forked
// from the caller join one Gloo group (parallel/process_group.h) through a store on loopback and all-reduce.
#pragma once

#include <cstdint>

namespace hybridflow::placement {

// The ring all-reduce model t = 2 (n - 1) latency + 2 (n - 1) / n x bytes / bus_bandwidth (role_costs.h),
// fitted by least squares to the best times of all-reduces of 4 bytes and of bytes / 64, bytes / 8 and bytes.
struct CollectiveProbe {
  double bus_bandwidth = 0;  // bytes/s
  double latency_s = 0;      // per ring step
};

// Forks `ranks` processes. Call it before this process runs any multi-threaded OpenMP work (a forked child
// that uses OpenMP after its parent did can hang; docs/performance.md). Error when a rank fails.
CollectiveProbe measure_local_allreduce(int ranks = 2, int64_t bytes = 32 << 20, int reps = 5);

}  // namespace hybridflow::placement
