#include "hybridflow/core/heap_reuse.h"

#include <cstdlib>
#include <cstring>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "hybridflow/core/error.h"

namespace hybridflow {

bool heap_reuse_requested(const char* return_freed_memory) {
  if (return_freed_memory == nullptr || std::strcmp(return_freed_memory, "") == 0 ||
      std::strcmp(return_freed_memory, "0") == 0)
    return true;
  HF_CHECK(std::strcmp(return_freed_memory, "1") == 0, kReturnFreedMemoryEnv, " must be 0 or 1, got '",
           return_freed_memory, "'");
  return false;
}

bool keep_freed_heap_for_reuse() {
  if (!heap_reuse_requested(std::getenv(kReturnFreedMemoryEnv))) return false;
#if defined(__GLIBC__)
  // No block from its own mmap (M_MMAP_THRESHOLD cannot exceed 32 MB, so only M_MMAP_MAX covers the large
  // ones), and never give the heap's top back: a freed block waits for the next allocation that fits.
  // Threads other than the main one allocate from their own arenas, which still map blocks too large for
  // them: backward passes and optimizer steps run on the calling thread, so the step's blocks come from the
  // main heap.
  const bool no_mmap = mallopt(M_MMAP_MAX, 0) == 1;
  const bool no_trim = mallopt(M_TRIM_THRESHOLD, -1) == 1;  // -1: the largest size, never reached
  return no_mmap && no_trim;
#else
  return false;
#endif
}

}  // namespace hybridflow
