// The bytes libtorch's CPU allocator has handed out, for measuring the peak memory of a computation (the
// bench's memory lines, tests that memory does not grow with a size). Off until install_cpu_memory_tracking()
// wraps the CPU allocator for the rest of the process: tensors allocated before are not counted, nor their
// frees. Memory that bypasses libtorch's allocator (BLAS work buffers, the C++ heap) is not counted either.
#pragma once

#include <cstdint>
#include <functional>

namespace hybridflow {

// Idempotent; throws if the CPU allocator cannot be wrapped (one without a raw deleter).
void install_cpu_memory_tracking();
int64_t cpu_memory_current_bytes();  // bytes allocated since install and not yet freed
int64_t cpu_memory_peak_bytes();     // the most current_bytes has been since install or the last reset
void reset_cpu_memory_peak();        // peak = current

// The peak of fn() above the bytes allocated when it starts (tracking installed first).
int64_t peak_cpu_bytes_during(const std::function<void()>& fn);

}  // namespace hybridflow
