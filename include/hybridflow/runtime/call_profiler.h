// The worker side of global_profiler (verl's profiler keys, tool torch): the controller arms a hosted role
// for one step with the methods to profile (the built-in worker method kProfileMethod, sent to every rank of
// the group), and every call of those methods on the selected ranks then runs under libtorch's Kineto
// profiler, until the controller disarms the role at the step's end. Each profiled call leaves a Chrome trace
// and one line of summary (core/kineto_profile.h: wall and device-busy time, operator and kernel counts, the
// top operators, hybridflow's named phases such as hf::backward) under <dir>/step_<N>/.
//
// With verl's tool torch_memory the armed ranks instead record their CUDA allocations from the first armed step
// on (core/cuda_memory_history.h), and at each armed step's end (the disarm) write the allocator's snapshot with
// that history: <dir>/step_<N>/<role>_rank<R>.memory.pickle, for https://pytorch.org/memory_viz. A rank on the
// CPU has no CUDA allocator to record: it says so once in the log and runs on.
#pragma once

#include <torch/types.h>

#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>

#include "hybridflow/core/cuda_memory_history.h"
#include "hybridflow/core/data_proto.h"

namespace hybridflow {

// Every worker process answers this method for each role it hosts (WorkerHost), whatever the worker type:
// meta "profile" is a CallProfileRequest's JSON to arm the role, or null to disarm it.
inline constexpr const char* kProfileMethod = "hf_profile";

// verl's tool_config.torch.contents that the profiler honours: cpu, cuda, memory, shapes, stack.
bool is_profile_content(const std::string& content);

struct CallProfileRequest {
  // Methods and the ranks that profile them, with what is recorded: a role hosting several of verl's profiler
  // sections (the actor's worker runs the actor's, the rollout's and the reference's calls) has one each.
  struct Target {
    std::set<std::string> methods;
    bool all_ranks = false;  // else only `ranks` (the role's ranks)
    std::set<int> ranks;
    std::vector<std::string> contents;  // verl's tool_config.torch.contents: cpu, cuda, memory, shapes, stack
  };
  std::string tool = "torch";  // global_profiler.tool: torch (each call profiled) or torch_memory (see above)
  CudaMemoryHistoryOptions memory;  // torch_memory's options (global_tool_config.torch_memory)
  int64_t step = 0;  // the trainer's step (1-based, verl's global_steps) the calls belong to
  std::string dir;   // global_profiler.save_path; the files go to <dir>/step_<step>/
  bool trace = true;  // global_profiler.trace: write each call's Chrome trace (false: the summary lines only)
  std::vector<Target> targets;

  // Error naming the entry and what is expected.
  static CallProfileRequest from_json(const nlohmann::json& j);
  nlohmann::json to_json() const;
  // Where the step's files go: <dir>/step_<step>.
  std::string step_dir() const { return dir + "/step_" + std::to_string(step); }
  // Whether any target selects `rank` (torch_memory records a rank's whole step).
  bool covers(int rank) const {
    for (const Target& t : targets)
      if (t.all_ranks || t.ranks.count(rank) > 0) return true;
    return false;
  }
  // The target that profiles `method` on `rank`, or null.
  const Target* select(int rank, const std::string& method) const {
    for (const Target& t : targets)
      if (t.methods.count(method) > 0 && (t.all_ranks || t.ranks.count(rank) > 0)) return &t;
    return nullptr;
  }
};

// One hosted role's profiler state.
class CallProfiler {
 public:
  // Arms (or with nullopt disarms) the role `role`, whose rank this process is, on `device`. With torch_memory,
  // disarming (or arming the next step) writes the armed step's snapshot; a snapshot that cannot be written is
  // a warning in the log.
  void arm(std::optional<CallProfileRequest> request, const std::string& role, int rank, const torch::Device& device);
  bool armed() const { return request_.has_value(); }
  // Runs `call`; with tool torch, under the profiler when armed for `method` on this rank. Writes
  // <dir>/step_<N>/<role>_rank<R>_<method>_<k>.trace.json (k: the method's k-th call of the step; unless the
  // request says no trace) and appends the summary to <dir>/step_<N>/<role>_rank<R>.summary.jsonl. A profile
  // that cannot be made or written is a warning in the log: the call itself runs and returns either way.
  DataProto run(const std::string& role, int rank, const std::string& method, const torch::Device& device,
                const std::function<DataProto()>& call);

 private:
  void write_memory_snapshot(const std::string& role, int rank) const;

  std::optional<CallProfileRequest> request_;
  std::map<std::string, int> calls_;  // of each method since the role was armed
  bool recording_memory_ = false;     // torch_memory: this process records its CUDA allocations
  bool said_no_cuda_ = false;         // torch_memory on the CPU: logged once
};

}  // namespace hybridflow
