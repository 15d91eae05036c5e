// The CUDA caching allocator's history, as PyTorch records it for its memory visualizer: every allocation and
// free of a process's GPU memory with the C++ stack that made it, and a snapshot of the allocator's segments
// with that history, in the pickle format torch.cuda.memory._dump_snapshot writes (https://pytorch.org/memory_viz
// and torch/cuda/_memory_viz.py read it). verl's global_profiler tool torch_memory turns this on
// (runtime/call_profiler.h). Needs the CUDA build (HF_WITH_CUDA); elsewhere every call is an error saying so.
#pragma once

#include <cstdint>
#include <string>

namespace hybridflow {

struct CudaMemoryHistoryOptions {
  int64_t max_entries = 100000;  // the most allocation events kept (the oldest are dropped)
  std::string context = "all";   // what is recorded: "alloc" (allocations), "state" (the live state), or "all"
  std::string stacks = "all";    // "cpp" or "all" (a C++ process has no Python frames: both record C++ stacks)
};

// True in the CUDA build.
bool cuda_memory_history_built();
// Starts (or restarts with new options) recording this process's CUDA allocations.
void start_cuda_memory_history(const CudaMemoryHistoryOptions& options);
// Stops recording; the history recorded so far stays in the next snapshot.
void stop_cuda_memory_history();
// The allocator's segments and recorded history, pickled.
std::string cuda_memory_snapshot();
// Error naming `key` unless context and stacks are among the values above.
void check_cuda_memory_history_options(const CudaMemoryHistoryOptions& options, const std::string& key);

}  // namespace hybridflow
