#include "hybridflow/core/cuda_memory_history.h"

#include "hybridflow/core/error.h"

#ifdef HF_WITH_CUDA
#include <torch/csrc/cuda/memory_snapshot.h>
#endif

namespace hybridflow {

#ifndef HF_WITH_CUDA
namespace {

[[noreturn]] void memory_history_not_built() {
  HF_FAIL("CUDA memory history (global_profiler.tool torch_memory) records the CUDA caching allocator: this is ",
          "the CPU build (build with HF_CUDA=1)");
}

}  // namespace
#endif

bool cuda_memory_history_built() {
#ifdef HF_WITH_CUDA
  return true;
#else
  return false;
#endif
}

void check_cuda_memory_history_options(const CudaMemoryHistoryOptions& options, const std::string& key) {
  HF_CHECK(options.max_entries >= 1, key, ".trace_alloc_max_entries must be >= 1, got ", options.max_entries);
  HF_CHECK(options.context == "alloc" || options.context == "state" || options.context == "all", key,
           ".context: expected alloc, state or all, got '", options.context, "'");
  HF_CHECK(options.stacks == "python" || options.stacks == "cpp" || options.stacks == "all", key,
           ".stacks: expected python, cpp or all, got '", options.stacks, "'");
}

void start_cuda_memory_history(const CudaMemoryHistoryOptions& options) {
#ifdef HF_WITH_CUDA
  // libtorch's C++ recorder takes "cpp" or "all"; there are no Python frames to record in this process.
  torch::cuda::_record_memory_history("all", options.context, options.stacks == "python" ? "cpp" : options.stacks,
                                      static_cast<size_t>(options.max_entries));
#else
  (void)options;
  memory_history_not_built();
#endif
}

void stop_cuda_memory_history() {
#ifdef HF_WITH_CUDA
  torch::cuda::_record_memory_history(std::nullopt);
#else
  memory_history_not_built();
#endif
}

std::string cuda_memory_snapshot() {
#ifdef HF_WITH_CUDA
  return torch::cuda::_memory_snapshot_pickled();
#else
  memory_history_not_built();
#endif
}

}  // namespace hybridflow
