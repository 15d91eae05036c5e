// Counts the libtorch operator calls and the kernels a stretch of code would launch, on the CPU: a thread-local
// RecordFunction observer (what libtorch's profiler hooks into) sees every operator with its nesting. A kernel
// is an operator that does work (not a view, an allocation or a no-op conversion) and launched none of its own
// callees' kernels, or one scope named "hybridflow::" (the fused decode kernels, kernels/decode_kernels.h, whose
// CPU references stand in for their CUDA kernels: what they call inside is counted as nothing). The figures
// approximate the CUDA step's (cuBLAS may split a matmul in two, a CUDA scan is two kernels), and tests use
// them to bound what a decode step launches without a GPU.
#pragma once

#include <ATen/record_function.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace hybridflow::testing {

struct OperatorCounts {
  int64_t operator_calls = 0;
  int64_t kernels = 0;
};

class OperatorCounter {
 public:
  OperatorCounter() {
    state() = State{};
    handle_ = at::addThreadLocalCallback(
        at::RecordFunctionCallback(&OperatorCounter::enter, &OperatorCounter::leave)
            .scopes({at::RecordScope::FUNCTION, at::RecordScope::USER_SCOPE}));
  }
  ~OperatorCounter() { at::removeCallback(handle_); }
  OperatorCounter(const OperatorCounter&) = delete;
  OperatorCounter& operator=(const OperatorCounter&) = delete;

  OperatorCounts counts() const { return state().counts; }
  // The calls (at any depth) of the fused kernels whose names start with `prefix` ("hybridflow::few_rows").
  int64_t named_calls(const std::string& prefix) const {
    int64_t n = 0;
    for (const auto& [name, calls] : state().fused_calls)
      if (name.compare(0, prefix.size(), prefix) == 0) n += calls;
    return n;
  }

 private:
  struct Frame {
    bool fused = false;
    bool launched_below = false;  // a callee (at any depth) launched a kernel
  };
  struct State {
    std::vector<Frame> stack;
    int64_t inside_fused = 0;  // open "hybridflow::" scopes
    OperatorCounts counts;
    std::map<std::string, int64_t> fused_calls;  // by name, the "hybridflow::" scopes only
  };
  static State& state() {
    static thread_local State s;
    return s;
  }
  // Operators that launch nothing by themselves: views, allocations, and conversions that found nothing to do
  // (those that copy call aten::copy_, which counts).
  static bool launches_nothing(const char* name) {
    static const std::set<std::string> kNames = {
        "aten::empty", "aten::empty_strided", "aten::empty_like", "aten::view", "aten::reshape",
        "aten::_reshape_alias", "aten::as_strided", "aten::select", "aten::slice", "aten::narrow",
        "aten::unsqueeze", "aten::squeeze", "aten::expand", "aten::expand_as", "aten::transpose", "aten::t",
        "aten::permute", "aten::detach", "aten::alias", "aten::contiguous", "aten::resolve_conj",
        "aten::resolve_neg", "aten::_unsafe_view", "aten::flatten", "aten::unflatten", "aten::view_as",
        "aten::to", "aten::type_as", "aten::lift_fresh", "aten::split", "aten::chunk", "aten::unbind",
        "aten::result_type", "aten::is_nonzero", "aten::set_", "aten::resize_", "aten::lift"};
    return kNames.count(name) > 0;
  }
  static std::unique_ptr<at::ObserverContext> enter(const at::RecordFunction& fn) {
    State& s = state();
    const bool fused = std::strncmp(fn.name(), "hybridflow::", 12) == 0;
    if (s.inside_fused == 0) {
      ++s.counts.operator_calls;
      // HF_COUNT_TRACE=1 lists the counted calls, indented by depth (to see which operator launched what).
      static const bool trace = std::getenv("HF_COUNT_TRACE") != nullptr;
      if (trace) std::printf("%*s%s\n", static_cast<int>(2 * s.stack.size()), "", fn.name());
    }
    if (fused) {
      ++s.inside_fused;
      ++s.fused_calls[fn.name()];
    }
    s.stack.push_back({fused, false});
    return nullptr;
  }
  static void leave(const at::RecordFunction& fn, at::ObserverContext*) {
    State& s = state();
    if (s.stack.empty()) return;  // opened before the counter
    const Frame f = s.stack.back();
    s.stack.pop_back();
    bool launched = f.launched_below;
    if (f.fused) {
      --s.inside_fused;
      launched = s.inside_fused == 0;
      if (launched) ++s.counts.kernels;
    } else if (s.inside_fused == 0 && !launched && !launches_nothing(fn.name())) {
      ++s.counts.kernels;
      launched = true;
    }
    if (launched && !s.stack.empty()) s.stack.back().launched_below = true;
  }
  at::CallbackHandle handle_;
};

}  // namespace hybridflow::testing
