// Process-wide set-up that every entry point needs: thread counts and a check that matmul runs on
// a fast BLAS (libtorch silently falls back to the reference BLAS, ~25x slower).
#pragma once

#include <string>

namespace hybridflow {

struct BlasInfo {
  std::string library;   // resolved path of the BLAS shared object loaded in this process
  bool fast = false;     // OpenBLAS, MKL or BLIS
};

// OpenBLAS picks its kernels from the CPU model it detects; under many hypervisors (a generic
// "Intel Xeon Processor") it falls back to its slowest kernels (measured here: 26 GFLOP/s instead
// of 154 for a 1024^3 matmul on one core). OpenBLAS reads OPENBLAS_CORETYPE only when it is loaded,
// so when the variable is unset and the CPU flags allow a faster kernel family, this sets it and
// re-executes the program (argv unchanged; children inherit it). Call first thing in main().
// Does nothing when OPENBLAS_CORETYPE or HF_NO_BLAS_REEXEC is set, or no better kernel applies.
void select_openblas_kernels(char** argv);

// The OpenBLAS core type the CPU flags (a /proc/cpuinfo "flags" line) support best, or "" when
// OpenBLAS's own detection is as good. Exposed for tests.
std::string openblas_coretype_for_flags(const std::string& cpu_flags);

// Sets ATen's intra-op threads (and with OpenBLAS-openmp, BLAS threads). num_threads <= 0 means
// one per core, taken from HF_NUM_THREADS when set.
void init_threads(int num_threads = 0);

// Reads /proc/self/maps for the BLAS libtorch loaded.
BlasInfo detect_blas();

// Logs a loud warning when the BLAS is the slow reference one. Returns the detection.
BlasInfo warn_if_slow_blas();

}  // namespace hybridflow
