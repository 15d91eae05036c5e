#include "hybridflow/core/platform.h"

#include <ATen/Parallel.h>

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "hybridflow/core/logging.h"

namespace hybridflow {

std::string openblas_coretype_for_flags(const std::string& cpu_flags) {
  std::set<std::string> flags;
  std::istringstream in(cpu_flags);
  for (std::string f; in >> f;) flags.insert(f);
  auto has = [&](const char* f) { return flags.count(f) > 0; };
  if (has("avx512f") && has("avx512bw") && has("avx512vl") && has("avx512dq")) return "SkylakeX";
  if (has("avx2") && has("fma")) return "Haswell";
  return "";
}

void select_openblas_kernels(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr || std::getenv("HF_NO_BLAS_REEXEC") != nullptr) return;
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line, flags;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("flags", 0) == 0) {
      flags = line.substr(line.find(':') + 1);
      break;
    }
  }
  const std::string core = openblas_coretype_for_flags(flags);
  if (core.empty()) return;
  ::setenv("OPENBLAS_CORETYPE", core.c_str(), 1);
  ::execv("/proc/self/exe", argv);  // only returns on failure: then run on with OpenBLAS's own choice
}

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
