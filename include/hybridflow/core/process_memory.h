// How much memory this process holds, for the per-pool memory metrics of an RL run: the peak and current
// resident set from /proc/self/status (VmHWM, VmRSS), and on a CUDA device the caching allocator's peak and
// current bytes. Also the one call that hands cached device memory back between a colocated role's calls.
#pragma once

#include <cstdint>
#include <string>

namespace hybridflow {

struct ProcessMemory {
  int64_t peak_rss_bytes = 0;  // VmHWM: the resident set's high-water mark since the process started
  int64_t rss_bytes = 0;       // VmRSS: now
  // The CUDA caching allocator on this process's current device (-1: not a CUDA build, or no device in use).
  int64_t cuda_peak_bytes = -1;
  int64_t cuda_allocated_bytes = -1;
};

ProcessMemory process_memory();

// A "Name:   1234 kB" field of a /proc/<pid>/status text, in bytes; -1 when the field is missing.
int64_t status_field_bytes(const std::string& status, const std::string& field);

// Returns the CUDA caching allocator's unused blocks to the device (torch.cuda.empty_cache), so that the
// next colocated role can use them; a no-op without CUDA.
void release_cached_device_memory();

}  // namespace hybridflow
