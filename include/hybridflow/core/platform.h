// Process-wide set-up that every entry point needs: thread counts and a check that matmul runs on
// a fast BLAS (libtorch silently falls back to the reference BLAS, ~25x slower).
#pragma once

#include <string>

namespace hybridflow {

struct BlasInfo {
  std::string library;   // resolved path of the BLAS shared object loaded in this process
  bool fast = false;     // OpenBLAS, MKL or BLIS
};

// Sets ATen's intra-op threads (and with OpenBLAS-openmp, BLAS threads). num_threads <= 0 means
// one per core, taken from HF_NUM_THREADS when set.
void init_threads(int num_threads = 0);

// Reads /proc/self/maps for the BLAS libtorch loaded.
BlasInfo detect_blas();

// Logs a loud warning when the BLAS is the slow reference one. Returns the detection.
BlasInfo warn_if_slow_blas();

}  // namespace hybridflow
