#include "hybridflow/core/process_memory.h"

#include <sys/resource.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#ifdef HF_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace hybridflow {

int64_t status_field_bytes(const std::string& status, const std::string& field) {
  std::istringstream in(status);
  for (std::string line; std::getline(in, line);) {
    if (line.size() <= field.size() || line.compare(0, field.size(), field) != 0 || line[field.size()] != ':') continue;
    std::istringstream value(line.substr(field.size() + 1));
    int64_t amount = 0;
    std::string unit;
    if (!(value >> amount)) return -1;
    value >> unit;
    return unit == "kB" ? amount * 1024 : amount;
  }
  return -1;
}

ProcessMemory process_memory() {
  ProcessMemory m;
  std::ifstream file("/proc/self/status");
  std::stringstream text;
  text << file.rdbuf();
  m.peak_rss_bytes = status_field_bytes(text.str(), "VmHWM");
  m.rss_bytes = status_field_bytes(text.str(), "VmRSS");
  if (m.peak_rss_bytes < 0) {  // no procfs: getrusage's high-water mark (kilobytes on Linux)
    rusage usage{};
    if (::getrusage(RUSAGE_SELF, &usage) == 0) m.peak_rss_bytes = static_cast<int64_t>(usage.ru_maxrss) * 1024;
  }
#ifdef HF_WITH_CUDA
  // Only once this process has allocated on a GPU: before that the caching allocator has no per-device
  // state and getDeviceStats throws "Invalid device argument" (a CPU run of a CUDA build on a GPU machine).
  if (c10::cuda::device_count() > 0 && c10::cuda::CUDACachingAllocator::get()->initialized()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(c10::cuda::current_device());
    const auto& bytes = stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
    m.cuda_peak_bytes = bytes.peak;
    m.cuda_allocated_bytes = bytes.current;
  }
#endif
  return m;
}

void release_cached_device_memory() {
#ifdef HF_WITH_CUDA
  if (c10::cuda::device_count() > 0 && c10::cuda::CUDACachingAllocator::get()->initialized())
    c10::cuda::CUDACachingAllocator::emptyCache();
#endif
}

}  // namespace hybridflow
