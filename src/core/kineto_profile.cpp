// Kineto through libtorch's C++ profiler API (torch/csrc/autograd/profiler_kineto.h); see kineto_profile.h.
#include "hybridflow/core/kineto_profile.h"

#include <torch/csrc/autograd/profiler_kineto.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>

#include "hybridflow/core/error.h"
#include "hybridflow/core/steady_seconds.h"

namespace hybridflow {

namespace {

// libkineto::ActivityType's values (kineto/ActivityType.h, stable across releases; the header itself is not
// on every wheel's include path): host operators, device copies and fills, kernels, runtime and driver calls.
constexpr uint8_t kKinetoCpuOp = 0, kKinetoUserScope = 1, kKinetoMemcpy = 3, kKinetoMemset = 4, kKinetoKernel = 5,
                  kKinetoRuntime = 7, kKinetoDriver = 8;

using ProfileInterval = std::pair<uint64_t, uint64_t>;  // [start, end) in ns

double union_seconds(std::vector<ProfileInterval> spans) {
  std::sort(spans.begin(), spans.end());
  uint64_t total = 0, open = 0, close = 0;
  bool any = false;
  for (const auto& [start, end] : spans) {
    if (!any || start > close) {
      if (any) total += close - open;
      open = start, close = end, any = true;
    } else {
      close = std::max(close, end);
    }
  }
  if (any) total += close - open;
  return static_cast<double>(total) * 1e-9;
}

struct ProfiledCpuOp {
  std::string name;
  uint64_t thread = 0, start = 0, end = 0;
};

// Where a device activity's launching operator ran: the scopes it falls in are those open then.
struct LaunchSite {
  std::string op;
  uint64_t start = 0;
};

}  // namespace

ProfileWindow profile_call(const std::function<void()>& work, const std::function<void()>& drain, bool cuda,
                           const std::string& trace_path) {
  ProfileOptions options;
  options.cuda = cuda;
  return profile_call(work, drain, options, trace_path);
}

ProfileWindow profile_call(const std::function<void()>& work, const std::function<void()>& drain,
                           const ProfileOptions& options, const std::string& trace_path) {
  namespace prof = torch::autograd::profiler;
  using torch::profiler::impl::ActivityType;
  using torch::profiler::impl::ProfilerConfig;
  using torch::profiler::impl::ProfilerState;
  const bool cuda = options.cuda;
  std::set<ActivityType> activities{ActivityType::CPU};
  if (cuda) activities.insert(ActivityType::CUDA);
  const ProfilerConfig config(ProfilerState::KINETO, options.shapes, options.memory, options.stack);
  try {
    prof::prepareProfiler(config, activities);
    prof::enableProfiler(config, activities);
  } catch (const std::exception& e) {
    throw ProfilerUnavailable(std::string("profile: libtorch's profiler could not start: ") + e.what());
  }
  ProfileWindow window;
  window.cuda = cuda;
  const double start = steady_seconds();
  try {
    work();
    drain();
  } catch (...) {
    prof::disableProfiler();
    throw;
  }
  window.wall_seconds = steady_seconds() - start;
  const std::unique_ptr<prof::ProfilerResult> result = prof::disableProfiler();
  HF_CHECK(result != nullptr, "profile: the profiler returned no result");
  if (!trace_path.empty()) {
    // Kineto logs a file it cannot open and goes on: whether the file is there afterwards says it was written.
    std::error_code stale;
    std::filesystem::remove(trace_path, stale);
    try {
      result->save(trace_path);
    } catch (const std::exception& e) {
      window.trace_error = e.what();
    }
    if (window.trace_error.empty() && !std::filesystem::exists(trace_path))
      window.trace_error = "no file was written at " + trace_path;
  }

  std::vector<ProfiledCpuOp> ops, scopes;
  std::unordered_map<uint64_t, LaunchSite> op_by_correlation;
  std::vector<ProfileInterval> device_spans;
  for (const auto& e : result->events()) {
    const uint8_t type = e.activityType();
    if (type == kKinetoCpuOp) {
      ops.push_back({e.name(), e.startThreadId(), e.startNs(), e.endNs()});
      if (e.correlationId() > 0) op_by_correlation[e.correlationId()] = {e.name(), e.startNs()};
    } else if (type == kKinetoUserScope) {
      scopes.push_back({e.name(), e.startThreadId(), e.startNs(), e.endNs()});
    } else if (type == kKinetoRuntime || type == kKinetoDriver) {
      if (e.name().find("Launch") != std::string::npos) ++window.kernel_launches;
    }
  }
  window.operator_calls = static_cast<int64_t>(ops.size());
  for (const ProfiledCpuOp& scope : scopes) {
    ProfiledScope& s = window.scopes[scope.name];
    s.host_seconds += static_cast<double>(scope.end - scope.start) * 1e-9;
    s.calls += 1;
    for (const ProfiledCpuOp& op : ops) s.operator_calls += scope.start <= op.start && op.start < scope.end ? 1 : 0;
  }
  for (const auto& e : result->events()) {
    const uint8_t type = e.activityType();
    if (type != kKinetoKernel && type != kKinetoMemcpy && type != kKinetoMemset) continue;
    if (type == kKinetoKernel) ++window.kernels;
    device_spans.emplace_back(e.startNs(), e.endNs());
    const double seconds = static_cast<double>(e.endNs() - e.startNs()) * 1e-9;
    // Self device time goes to the innermost operator that launched the work (as torch.profiler's tables).
    const auto owner = op_by_correlation.find(e.linkedCorrelationId());
    const std::string name = owner != op_by_correlation.end() ? owner->second.op : "(kernel) " + e.name().substr(0, 80);
    window.operators[name].self_seconds += seconds;
    // And to every scope open when its operator started, on any thread: autograd runs a CUDA backward on a
    // device thread of its own, while the scope (hf::backward) is open on the thread that called backward().
    if (owner == op_by_correlation.end()) continue;
    for (const ProfiledCpuOp& scope : scopes)
      if (scope.start <= owner->second.start && owner->second.start < scope.end) {
        ProfiledScope& s = window.scopes[scope.name];
        s.device_seconds += seconds;
        if (type == kKinetoKernel) s.kernels += 1;
      }
  }
  // Host self time: each operator's time less its children's, nesting found per thread by containment.
  std::sort(ops.begin(), ops.end(), [](const ProfiledCpuOp& a, const ProfiledCpuOp& b) {
    return a.thread != b.thread ? a.thread < b.thread : a.start != b.start ? a.start < b.start : a.end > b.end;
  });
  std::vector<double> self(ops.size());
  std::vector<size_t> stack;
  std::vector<ProfileInterval> top_level;
  for (size_t i = 0; i < ops.size(); ++i) {
    const ProfiledCpuOp& op = ops[i];
    while (!stack.empty() && (ops[stack.back()].thread != op.thread || ops[stack.back()].end <= op.start))
      stack.pop_back();
    const double seconds = static_cast<double>(op.end - op.start) * 1e-9;
    self[i] = seconds;
    if (stack.empty()) {
      top_level.emplace_back(op.start, op.end);
    } else {
      self[stack.back()] -= seconds;
    }
    stack.push_back(i);
  }
  for (size_t i = 0; i < ops.size(); ++i) {
    ProfiledOperator& op = window.operators[ops[i].name];
    op.calls += 1;
    if (!cuda) op.self_seconds += self[i];
  }
  window.busy_seconds = union_seconds(cuda ? device_spans : top_level);
  return window;
}

nlohmann::json profile_summary_json(const ProfileWindow& window, size_t top_n) {
  nlohmann::json out = {{"wall_s", window.wall_seconds},
                        {"busy_s", window.busy_seconds},
                        {"busy_ratio", window.wall_seconds > 0 ? window.busy_seconds / window.wall_seconds : 0.0},
                        {"operator_calls", window.operator_calls},
                        {"device", window.cuda ? "cuda" : "cpu"}};
  if (window.cuda) {
    out["kernels"] = window.kernels;
    out["kernel_launches"] = window.kernel_launches;
  }
  std::vector<std::pair<std::string, ProfiledOperator>> top(window.operators.begin(), window.operators.end());
  std::sort(top.begin(), top.end(),
            [](const auto& a, const auto& b) { return a.second.self_seconds > b.second.self_seconds; });
  if (top.size() > top_n) top.resize(top_n);
  nlohmann::json ops = nlohmann::json::array();
  for (const auto& [name, op] : top) ops.push_back({{"name", name}, {"self_s", op.self_seconds}, {"calls", op.calls}});
  out["top_operators"] = std::move(ops);
  nlohmann::json scopes = nlohmann::json::object();
  for (const auto& [name, s] : window.scopes) {
    scopes[name] = {{"host_s", s.host_seconds}, {"calls", s.calls}, {"operator_calls", s.operator_calls}};
    if (window.cuda) {
      scopes[name]["device_s"] = s.device_seconds;
      scopes[name]["kernels"] = s.kernels;
    }
  }
  out["scopes"] = std::move(scopes);
  return out;
}

ProfileStepSummary per_step_difference(const ProfileWindow& longer, const ProfileWindow& shorter, int64_t steps,
                                       size_t top_n) {
  HF_CHECK(steps > 0, "profile: the step count must be positive, got ", steps);
  const double n = static_cast<double>(steps);
  ProfileStepSummary s;
  s.steps = steps;
  s.wall_seconds = (longer.wall_seconds - shorter.wall_seconds) / n;
  s.busy_seconds = (longer.busy_seconds - shorter.busy_seconds) / n;
  s.operator_calls = static_cast<double>(longer.operator_calls - shorter.operator_calls) / n;
  s.kernels = static_cast<double>(longer.kernels - shorter.kernels) / n;
  s.kernel_launches = static_cast<double>(longer.kernel_launches - shorter.kernel_launches) / n;
  for (const auto& [name, op] : longer.operators) {
    const auto other = shorter.operators.find(name);
    const ProfiledOperator base = other != shorter.operators.end() ? other->second : ProfiledOperator{};
    s.top.push_back({name, (op.self_seconds - base.self_seconds) / n, (op.calls - base.calls) / n});
  }
  std::sort(s.top.begin(), s.top.end(), [](const auto& a, const auto& b) { return a.self_seconds > b.self_seconds; });
  if (s.top.size() > top_n) s.top.resize(top_n);
  return s;
}

}  // namespace hybridflow
