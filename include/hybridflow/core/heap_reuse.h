// Keeping freed heap memory in the process for the next allocation of its size. glibc serves every block
// over 32 MB (and, by its sliding threshold, many smaller ones) with a fresh mmap and unmaps it on free, so a
// training step that drops its gradients and re-creates them, with the head's [vocabulary x hidden]
// gradients and the logits beside them, takes every page of those gigabytes through a page fault and the
// kernel's zeroing again each step (1.08 M minor faults, 4.3 GB, per step at the Qwen2.5-0.5B shape, batch
// 2 x 128 tokens). With mmap off and no trimming the freed blocks stay in the heap and the next step
// reuses them: no faults, same bits. The price: the process keeps its peak heap until it exits.
#pragma once

#include <string>

namespace hybridflow {

// The environment variable that keeps glibc's defaults (freed large blocks go back to the system) when
// set to 1, for a process that must shrink after a peak and to measure the difference.
inline constexpr const char* kReturnFreedMemoryEnv = "HF_RETURN_FREED_MEMORY";

// Whether heap reuse applies for this value of kReturnFreedMemoryEnv (unset: nullptr). Anything but
// unset, "" or "0" / "1" is a clear error naming the variable.
bool heap_reuse_requested(const char* return_freed_memory);

// Turns heap reuse on for this process unless kReturnFreedMemoryEnv says otherwise; call first thing in
// main(), before large allocations. Returns whether it is on (false also where the C library is not glibc).
bool keep_freed_heap_for_reuse();

}  // namespace hybridflow
