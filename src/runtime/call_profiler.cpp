#include "hybridflow/runtime/call_profiler.h"

#include <torch/cuda.h>

#include <algorithm>
#include <fstream>

#include "hybridflow/core/error.h"
#include "hybridflow/core/fs.h"
#include "hybridflow/core/kineto_profile.h"
#include "hybridflow/core/logging.h"

namespace hybridflow {

namespace {

bool has(const std::vector<std::string>& list, const std::string& item) {
  return std::find(list.begin(), list.end(), item) != list.end();
}

}  // namespace

bool is_profile_content(const std::string& content) {
  return content == "cpu" || content == "cuda" || content == "memory" || content == "shapes" || content == "stack";
}

CallProfileRequest CallProfileRequest::from_json(const nlohmann::json& j) {
  HF_CHECK(j.is_object(), "profile request: expected an object, got ", j.dump());
  CallProfileRequest r;
  r.step = j.at("step").get<int64_t>();
  HF_CHECK(r.step >= 1, "profile request: step must be >= 1, got ", r.step);
  r.dir = j.at("dir").get<std::string>();
  HF_CHECK(!r.dir.empty(), "profile request: an empty directory");
  r.trace = j.value("trace", true);
  r.tool = j.value("tool", std::string("torch"));
  HF_CHECK(r.tool == "torch" || r.tool == "torch_memory", "profile request: tool '", r.tool,
           "' is not torch or torch_memory");
  if (j.contains("memory")) {
    const nlohmann::json& m = j.at("memory");
    r.memory.max_entries = m.value("max_entries", r.memory.max_entries);
    r.memory.context = m.value("context", r.memory.context);
    r.memory.stacks = m.value("stacks", r.memory.stacks);
    check_cuda_memory_history_options(r.memory, "profile request: memory");
  }
  for (const nlohmann::json& t : j.at("targets")) {
    Target target;
    target.methods = t.at("methods").get<std::set<std::string>>();
    target.all_ranks = t.value("all_ranks", false);
    target.ranks = t.value("ranks", std::set<int>());
    target.contents = t.value("contents", std::vector<std::string>());
    for (const std::string& c : target.contents)
      HF_CHECK(is_profile_content(c), "profile request: content '", c, "' is not one of cpu, cuda, memory, shapes, stack");
    r.targets.push_back(std::move(target));
  }
  return r;
}

nlohmann::json CallProfileRequest::to_json() const {
  nlohmann::json targets_json = nlohmann::json::array();
  for (const Target& t : targets)
    targets_json.push_back(
        {{"methods", t.methods}, {"all_ranks", t.all_ranks}, {"ranks", t.ranks}, {"contents", t.contents}});
  return {{"step", step},
          {"dir", dir},
          {"trace", trace},
          {"tool", tool},
          {"memory", {{"max_entries", memory.max_entries}, {"context", memory.context}, {"stacks", memory.stacks}}},
          {"targets", std::move(targets_json)}};
}

void CallProfiler::arm(std::optional<CallProfileRequest> request, const std::string& role, int rank,
                       const torch::Device& device) {
  if (request_ && request_->tool == "torch_memory" && recording_memory_ && request_->covers(rank))
    write_memory_snapshot(role, rank);
  request_ = std::move(request);
  calls_.clear();
  if (!request_ || request_->tool != "torch_memory" || !request_->covers(rank) || recording_memory_) return;
  if (!device.is_cuda() || !cuda_memory_history_built()) {
    if (!said_no_cuda_)
      log_warn("profile: global_profiler.tool torch_memory records the CUDA caching allocator, and ", role, " rank ",
               rank, " runs on the CPU", cuda_memory_history_built() ? "" : " (the CPU build)", ": no memory snapshots");
    said_no_cuda_ = true;
    return;
  }
  // From the first armed step on, as verl records from the worker's start: a snapshot holds the history that
  // led to it (up to max_entries events).
  try {
    start_cuda_memory_history(request_->memory);
    recording_memory_ = true;
  } catch (const std::exception& e) {
    log_warn("profile: ", role, " rank ", rank, ": CUDA memory history not recorded: ", e.what());
  }
}

void CallProfiler::write_memory_snapshot(const std::string& role, int rank) const {
  const CallProfileRequest& r = *request_;
  const std::string dir = r.step_dir();
  const std::string path = dir + "/" + role + "_rank" + std::to_string(rank) + ".memory.pickle";
  try {
    make_dirs(dir);
    write_file_atomic(path, cuda_memory_snapshot());
    log_info("profile: ", role, " rank ", rank, " (step ", r.step, "): CUDA memory snapshot ", path);
  } catch (const std::exception& e) {
    log_warn("profile: ", role, " rank ", rank, " (step ", r.step, "): no memory snapshot: ", e.what());
  }
}

DataProto CallProfiler::run(const std::string& role, int rank, const std::string& method, const torch::Device& device,
                            const std::function<DataProto()>& call) {
  const CallProfileRequest::Target* target =
      request_ && request_->tool == "torch" ? request_->select(rank, method) : nullptr;
  if (target == nullptr) return call();
  const CallProfileRequest& r = *request_;
  const std::vector<std::string>& contents = target->contents;
  const int k = ++calls_[method];
  const std::string dir = r.step_dir();
  // A profile that cannot be made costs the profile, never the call: the run goes on without it.
  try {
    make_dirs(dir);
  } catch (const std::exception& e) {
    log_warn("profile: ", role, " rank ", rank, " ", method, " (step ", r.step, ") runs unprofiled: ", e.what());
    return call();
  }
  const std::string stem = dir + "/" + role + "_rank" + std::to_string(rank) + "_" + method + "_" + std::to_string(k);
  ProfileOptions options;
  // An empty list is verl's default: the host, and the device where there is one.
  options.cuda = device.is_cuda() && (contents.empty() || has(contents, "cuda"));
  options.shapes = has(contents, "shapes");
  options.memory = has(contents, "memory");
  options.stack = has(contents, "stack");
  DataProto out;
  ProfileWindow window;
  try {
    window = profile_call([&] { out = call(); },
                          [&] {
                            if (device.is_cuda()) torch::cuda::synchronize(device.index());
                          },
                          options, r.trace ? stem + ".trace.json" : std::string());
  } catch (const ProfilerUnavailable& e) {
    log_warn("profile: ", role, " rank ", rank, " ", method, " (step ", r.step, ") runs unprofiled: ", e.what());
    return call();
  }
  const bool traced = r.trace && window.trace_error.empty();
  if (!window.trace_error.empty())
    log_warn("profile: ", role, " rank ", rank, " ", method, " (step ", r.step, "): no trace: ", window.trace_error);
  nlohmann::json line = {{"step", r.step}, {"role", role}, {"rank", rank}, {"method", method}, {"call", k},
                         {"trace", traced ? nlohmann::json(stem + ".trace.json") : nlohmann::json()}};
  line.update(profile_summary_json(window));
  const std::string summary = dir + "/" + role + "_rank" + std::to_string(rank) + ".summary.jsonl";
  std::ofstream f(summary, std::ios::app);
  f << line.dump() << "\n";
  if (!f.good()) log_warn("profile: cannot append to ", summary, "; the line below is all that is kept of this call");
  log_info("profile: ", role, " rank ", rank, " ", method, " (step ", r.step, ", call ", k, "): ", window.wall_seconds,
           " s, ", window.cuda ? "device busy " : "host busy ", window.busy_seconds, " s, ", window.operator_calls,
           " operator calls", window.cuda ? ", " + std::to_string(window.kernels) + " kernels" : std::string(),
           traced ? "; trace " + stem + ".trace.json" : std::string());
  return out;
}

}  // namespace hybridflow
