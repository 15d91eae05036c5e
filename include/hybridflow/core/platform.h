// Process-wide set-up that every entry point needs (thread counts), and what this build and machine offer:
// libtorch version, BLAS, CPU bf16 support, CUDA devices and collective backends (`hybridflow info`).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace hybridflow {

struct BlasInfo {
  std::string library;  // the BLAS libtorch was built with (its BLAS_INFO: "mkl", "open", ...)
  bool fast = false;    // MKL, OpenBLAS, BLIS or Accelerate, not the reference BLAS
};

// Sets ATen's intra-op threads (with them, MKL's and oneDNN's). num_threads <= 0 means one per core,
// taken from HF_NUM_THREADS when set.
void init_threads(int num_threads = 0);

// The BLAS of this libtorch, read from its build configuration.
BlasInfo detect_blas();

// Logs a loud warning when libtorch was built with no fast BLAS (matmul ~25x slower). Returns the detection.
BlasInfo warn_if_slow_blas();

struct CpuBf16Support {
  bool avx512_bf16 = false;  // AVX512-BF16 dot products
  bool amx_bf16 = false;     // AMX tiles with bf16
  // What bf16 matmuls run on here: "AMX (oneDNN)", "AVX512-BF16 (oneDNN)", or "emulated (converts to fp32)".
  std::string matmul_path() const;
};

// From a /proc/cpuinfo "flags" line (exposed for tests); cpu_bf16_support() reads this machine's.
CpuBf16Support cpu_bf16_support_from_flags(const std::string& cpu_flags);
CpuBf16Support cpu_bf16_support();

struct RuntimeInfo {
  std::string torch_version;         // "2.15.0"
  bool cuda_build = false;           // built with HF_CUDA (libtorch_cuda linked, NCCL available)
  std::vector<std::string> cuda_devices;  // names of the visible CUDA devices
  std::string cpu_capability;        // the vector ISA ATen dispatches to ("AVX512", "AVX2", ...)
  CpuBf16Support bf16;
  BlasInfo blas;
  bool onednn = false;
  int threads = 0;                   // ATen intra-op threads now
  std::vector<std::string> collective_backends;  // "gloo", and "nccl" in a CUDA build
};

// A device config value ("cpu", "cuda" or "auto": cuda when this build sees a GPU) as "cpu" or "cuda". An
// Error names `key` when the value is none of those, or cuda is asked for where this build or machine has none.
// The memory of CUDA device `index` in bytes (what the rollout's gpu_memory_utilization is a fraction of);
// 0 on a CPU build or when there is no such device.
int64_t cuda_device_memory_bytes(int index);

std::string resolve_device_name(const std::string& value, const std::string& key);

// The device for a run that starts `processes` worker processes on each host that sees `cuda_devices` GPUs.
// Each process takes its own GPU (LOCAL_RANK modulo the count), and NCCL refuses a group in which two ranks
// share one, so a run with more processes per host than GPUs cannot use them: `auto` then falls back to
// the CPU with a warning, and an explicit cuda is an Error naming `key`, the process count and `pools`
// (describe_placement's lines: each pool's processes and the key that sets them).
std::string device_for_processes(const std::string& resolved, const std::string& requested, int processes,
                                 int64_t cuda_devices, const std::string& key, const std::string& pools);

// Seeds the CPU's default generator only. torch::manual_seed also seeds every CUDA device, which starts
// CUDA in the calling process: a process that then forks (the multi-rank tests) leaves its children unable
// to use CUDA at all, and a CPU-only role would hold a CUDA context for nothing. Weights are initialised on
// the CPU, so this seed alone fixes them.
void seed_cpu_generator(uint64_t seed);

RuntimeInfo runtime_info();
// Human-readable, one "key   value" line each.
std::string format_runtime_info(const RuntimeInfo& info);

}  // namespace hybridflow
