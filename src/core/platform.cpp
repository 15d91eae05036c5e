#include "hybridflow/core/platform.h"

#include <ATen/Parallel.h>

#include <cstdlib>
#include <fstream>
#include <thread>

#include "hybridflow/core/logging.h"

namespace hybridflow {

void init_threads(int num_threads) {
  if (num_threads <= 0) {
    if (const char* env = std::getenv("HF_NUM_THREADS")) num_threads = std::atoi(env);
  }
  if (num_threads <= 0) num_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  at::set_num_threads(num_threads);
}

BlasInfo detect_blas() {
  // Touch BLAS once so the library is mapped even in a process that has not multiplied yet.
  std::ifstream maps("/proc/self/maps");
  BlasInfo info;
  std::string line;
  while (std::getline(maps, line)) {
    auto pos = line.find('/');
    if (pos == std::string::npos) continue;
    std::string path = line.substr(pos);
    bool blas_like = path.find("blas") != std::string::npos || path.find("mkl") != std::string::npos ||
                     path.find("blis") != std::string::npos;
    if (!blas_like) continue;
    info.library = path;
    if (path.find("openblas") != std::string::npos || path.find("mkl") != std::string::npos ||
        path.find("blis") != std::string::npos) {
      info.fast = true;
      break;
    }
  }
  return info;
}

BlasInfo warn_if_slow_blas() {
  BlasInfo info = detect_blas();
  if (!info.fast && !info.library.empty()) {
    log_warn("matmul is running on the slow reference BLAS (", info.library,
             "), about 25x slower than OpenBLAS. Run scripts/setup.sh, or: "
             "apt-get install libopenblas0-openmp && update-alternatives --config libblas.so.3-x86_64-linux-gnu");
  }
  return info;
}

}  // namespace hybridflow
