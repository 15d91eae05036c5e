#include "hybridflow/core/platform.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <torch/cuda.h>
#include <torch/headeronly/version.h>
#ifdef HF_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

#include <cstdlib>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "hybridflow/core/error.h"
#include "hybridflow/core/logging.h"

namespace hybridflow {

void init_threads(int num_threads) {
  if (num_threads <= 0) {
    if (const char* env = std::getenv("HF_NUM_THREADS")) num_threads = std::atoi(env);
  }
  if (num_threads <= 0) num_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  at::set_num_threads(num_threads);
}

std::string resolve_device_name(const std::string& value, const std::string& key) {
  HF_CHECK(value == "auto" || value == "cpu" || value == "cuda", key, ": expected cpu | cuda | auto, got '", value, "'");
  const bool have_cuda = torch::cuda::is_available();
  if (value == "auto") return have_cuda ? "cuda" : "cpu";
#ifdef HF_WITH_CUDA
  const char* why = "no CUDA device is visible to this process (check CUDA_VISIBLE_DEVICES and the driver)";
#else
  const char* why = "this is a CPU build of hybridflow: rebuild with HF_CUDA=1 (scripts/build.sh) on a machine with a GPU";
#endif
  HF_CHECK(value == "cpu" || have_cuda, key, "=cuda, but ", why, "; or set ", key, "=cpu");
  return value;
}

std::string device_for_processes(const std::string& resolved, const std::string& requested, int processes,
                                 int64_t cuda_devices, const std::string& key, const std::string& pools) {
  if (resolved != "cuda" || processes <= cuda_devices) return resolved;
  const std::string why = "this run starts " + std::to_string(processes) + " worker processes per host but " +
                          std::to_string(cuda_devices) +
                          " CUDA device(s) are visible; each process needs a GPU of its own (NCCL refuses two ranks "
                          "on one device)";
  HF_CHECK(requested == "auto", key, "=cuda: ", why,
           ". Use fewer processes (colocate the roles in one pool), more GPUs, or ", key, "=cpu. The pools:\n", pools);
  log_warn(key, "=auto: ", why, "; running on the CPU. The pools:\n", pools);
  return "cpu";
}

BlasInfo detect_blas() {
  // at::show_config() lists the build settings, among them "BLAS_INFO=mkl".
  const std::string config = at::show_config();
  BlasInfo info;
  const auto pos = config.find("BLAS_INFO=");
  if (pos != std::string::npos) {
    const auto end = config.find_first_of(", \n", pos);
    info.library = config.substr(pos + 10, end == std::string::npos ? std::string::npos : end - pos - 10);
  }
  for (const char* fast : {"mkl", "open", "blis", "accelerate", "flexi"})
    if (info.library.find(fast) != std::string::npos) info.fast = true;
  return info;
}

BlasInfo warn_if_slow_blas() {
  BlasInfo info = detect_blas();
  if (!info.fast) {
    log_warn("this libtorch was built with BLAS '", info.library,
             "', not MKL or OpenBLAS: matmul may be ~25x slower. Build against the PyPI torch wheel "
             "(scripts/setup.sh installs it).");
  }
  return info;
}

std::string CpuBf16Support::matmul_path() const {
  if (amx_bf16) return "AMX (oneDNN)";
  if (avx512_bf16) return "AVX512-BF16 (oneDNN)";
  return "emulated (converts to fp32; no faster than fp32)";
}

CpuBf16Support cpu_bf16_support_from_flags(const std::string& cpu_flags) {
  std::set<std::string> flags;
  std::istringstream in(cpu_flags);
  for (std::string f; in >> f;) flags.insert(f);
  CpuBf16Support s;
  s.avx512_bf16 = flags.count("avx512_bf16") > 0;
  s.amx_bf16 = flags.count("amx_bf16") > 0 && flags.count("amx_tile") > 0;
  return s;
}

CpuBf16Support cpu_bf16_support() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("flags", 0) == 0) return cpu_bf16_support_from_flags(line.substr(line.find(':') + 1));
  }
  return {};
}

int64_t cuda_device_memory_bytes([[maybe_unused]] int index) {
#ifdef HF_WITH_CUDA
  if (index < 0 || index >= static_cast<int>(torch::cuda::device_count())) return 0;
  return static_cast<int64_t>(at::cuda::getDeviceProperties(static_cast<c10::DeviceIndex>(index))->totalGlobalMem);
#else
  return 0;
#endif
}

RuntimeInfo runtime_info() {
  RuntimeInfo info;
  info.torch_version = TORCH_VERSION;
#ifdef HF_WITH_CUDA
  info.cuda_build = true;
  for (int64_t i = 0; i < static_cast<int64_t>(torch::cuda::device_count()); ++i) {
    const auto* props = at::cuda::getDeviceProperties(static_cast<c10::DeviceIndex>(i));
    info.cuda_devices.push_back(std::string(props->name) + " (" +
                                std::to_string(cuda_device_memory_bytes(static_cast<int>(i)) >> 20) + " MiB)");
  }
#endif
  info.cpu_capability = at::get_cpu_capability();
  info.bf16 = cpu_bf16_support();
  info.blas = detect_blas();
  info.onednn = at::hasMKLDNN();
  info.threads = at::get_num_threads();
  info.collective_backends.push_back("gloo (CPU tensors)");
  if (info.cuda_build) info.collective_backends.push_back("nccl (CUDA tensors)");
  return info;
}

std::string format_runtime_info(const RuntimeInfo& info) {
  std::ostringstream out;
  auto join = [](const std::vector<std::string>& items, const char* empty) {
    std::string s;
    for (const auto& item : items) s += (s.empty() ? "" : ", ") + item;
    return s.empty() ? std::string(empty) : s;
  };
  out << "libtorch         " << info.torch_version << (info.cuda_build ? " (CUDA build)" : " (CPU build)") << "\n";
  out << "devices          cpu" << (info.cuda_devices.empty() ? "" : ", ") << join(info.cuda_devices, "")
      << (info.cuda_build && info.cuda_devices.empty() ? " (no CUDA device visible)" : "") << "\n";
  out << "cpu isa          " << info.cpu_capability << ", " << info.threads << " threads\n";
  out << "blas             " << info.blas.library << (info.blas.fast ? "" : " (slow)") << "\n";
  out << "dtypes           fp32; bf16 matmul: " << info.bf16.matmul_path()
      << (info.onednn ? "" : " (libtorch without oneDNN)") << (info.cuda_build ? "; bf16 on CUDA devices" : "")
      << "\n";
  out << "collectives      " << join(info.collective_backends, "none") << "\n";
  return out.str();
}

void seed_cpu_generator(uint64_t seed) {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_current_seed(seed);
}

}  // namespace hybridflow
