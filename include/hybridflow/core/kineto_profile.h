// libtorch's Kineto profiler around a piece of work, from C++: the operators it ran (ATen calls, nested ones
// included), the CUDA kernels the device ran and the launches the host made for them, how long the device was
// busy, each operator's self time and the time inside each of hybridflow's named phases (RECORD_USER_SCOPE);
// optionally the whole trace as Chrome-trace JSON (chrome://tracing, Perfetto). `hybridflow bench generate
// --profile` uses it to explain decode speed from a profile, and the workers to profile the calls of the steps
// global_profiler.steps names (runtime/call_profiler.h).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "hybridflow/core/error.h"

namespace hybridflow {

struct ProfiledOperator {
  double self_seconds = 0;  // on CUDA: its kernels' device time; on the CPU: its time less its children's
  double calls = 0;
};

// A named phase (a user scope: RECORD_USER_SCOPE("hf::backward")) summed over its occurrences in the window.
struct ProfiledScope {
  double host_seconds = 0;    // wall time between its start and end on the host
  double device_seconds = 0;  // CUDA: the device time of the kernels, copies and fills launched while it was
                              // open (from any thread: a CUDA backward runs on autograd's device thread)
  double calls = 0;
  double operator_calls = 0;  // operators started while it was open (any thread), nested calls included
  double kernels = 0;         // CUDA: kernels launched while it was open
};

// What the profiler records beyond host operators (and CUDA activity, on a CUDA device): verl's
// tool_config.torch.contents "shapes", "memory" and "stack".
struct ProfileOptions {
  bool cuda = false;    // record device activity (a CUDA model)
  bool shapes = false;  // operators' input shapes, in the trace
  bool memory = false;  // allocations and frees, in the trace
  bool stack = false;   // the host call stack of each operator, in the trace
};

// The profiler could not start (nothing of the work ran): a caller may run the work unprofiled instead.
class ProfilerUnavailable : public Error {
 public:
  using Error::Error;
};

// What one profiled call did.
struct ProfileWindow {
  bool cuda = false;            // device activity was recorded (a CUDA model)
  double wall_seconds = 0;      // the call, the device drained at its end
  double busy_seconds = 0;      // CUDA: the union of kernel, memcpy and memset time; CPU: of top-level operators
  int64_t operator_calls = 0;   // every recorded ATen operator, nested calls included
  int64_t kernels = 0;          // kernels the device ran (0 on the CPU)
  int64_t kernel_launches = 0;  // host calls that launch work (cudaLaunchKernel, cudaGraphLaunch, ...)
  std::map<std::string, ProfiledOperator> operators;  // by name: device self time on CUDA, CPU self time else
  std::map<std::string, ProfiledScope> scopes;        // by name, nested ones each counted in full
  std::string trace_error;  // why the trace could not be written ("" when it was, or none was asked for)
};

// Runs `work` under the profiler (CPU operators, and CUDA activity when `cuda`), then waits for the device
// (`drain`) inside the window. Writes the Chrome trace to trace_path when it is not empty; a trace that cannot
// be written is reported in trace_error, not thrown (the work has run). ProfilerUnavailable when the profiler
// cannot start; the work's own errors pass through with the profiler stopped.
ProfileWindow profile_call(const std::function<void()>& work, const std::function<void()>& drain, bool cuda,
                           const std::string& trace_path = "");
ProfileWindow profile_call(const std::function<void()>& work, const std::function<void()>& drain,
                           const ProfileOptions& options, const std::string& trace_path = "");

// The window as one JSON object: wall and busy seconds, operator (and on CUDA kernel and launch) counts, the
// `top_n` operators by self time and every scope. What the worker-side profiler writes per call.
nlohmann::json profile_summary_json(const ProfileWindow& window, size_t top_n = 20);

struct ProfileStepSummary {
  int64_t steps = 0;
  double wall_seconds = 0, busy_seconds = 0;  // per step
  double operator_calls = 0, kernels = 0, kernel_launches = 0;  // per step
  double busy_ratio() const { return wall_seconds > 0 ? busy_seconds / wall_seconds : 0.0; }
  struct Top {
    std::string name;
    double self_seconds = 0, calls = 0;  // per step
  };
  std::vector<Top> top;  // by self time per step, largest first
};

// Per step of the work `longer` did beyond `shorter` (say a run of 1 + steps decode tokens against one of 1:
// the prefill cancels), as the decode benchmark separates decode from prefill. The `top_n` operators by self
// time per step.
ProfileStepSummary per_step_difference(const ProfileWindow& longer, const ProfileWindow& shorter, int64_t steps,
                                       size_t top_n = 10);

}  // namespace hybridflow
