// The registry of RL programs: the built-ins of programs/ plus any a binary registers.
#include "hybridflow/trainer/rl_program.h"

#include <map>
#include <mutex>
#include <sstream>

#include "hybridflow/core/error.h"
#include "programs/programs.h"
#include "run_spec_builders.h"

namespace hybridflow {

namespace {

struct RegisteredProgram {
  RLProgram run;
  RLProgramCheck check;  // may be empty
};

struct Registry {
  std::mutex mutex;
  std::map<std::string, RegisteredProgram> programs;
};

// Built-ins are listed here rather than registered by static objects: a static library drops objects
// that nothing references, and their registrations with them.
Registry& registry() {
  static Registry* r = [] {
    auto* reg = new Registry;
    // The estimator program under the names of the estimators it is known by (PPO's is gae).
    reg->programs = {{"ppo", {programs::with_estimator("gae"), {}}},
                     {"grpo", {programs::with_estimator("grpo"), {}}},
                     {"rloo", {programs::with_estimator("rloo"), {}}},
                     {"reinforce_plus_plus", {programs::with_estimator("reinforce_plus_plus"), {}}},
                     {"policy_gradient", {programs::with_configured_estimator(), {}}},
                     {"remax", {programs::remax, {}}},
                     {"safe_rlhf", {programs::safe_rlhf, {}}},
                     {"dapo", {programs::dapo, {}}}};  // their checks: run_spec_builders.cpp
    return reg;
  }();
  return *r;
}

}  // namespace

void register_rl_program(const std::string& name, RLProgram program, RLProgramCheck check) {
  HF_CHECK(!name.empty() && name != "auto", "register_rl_program: the name must be non-empty and not 'auto'");
  HF_CHECK(static_cast<bool>(program), "register_rl_program: program '", name, "' has no function");
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.programs[name] = {std::move(program), std::move(check)};
}

const RLProgram& get_rl_program(const std::string& name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.programs.find(name);
  if (it == r.programs.end()) {
    std::ostringstream known;
    for (const auto& entry : r.programs) known << (known.tellp() > 0 ? ", " : "") << entry.first;
    HF_FAIL("algorithm.program: unknown program '", name, "' (known: auto, ", known.str(), ")");
  }
  return it->second.run;
}

void check_rl_program(const std::string& name, const Config& config) {
  RLProgramCheck check;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    auto it = r.programs.find(name);
    if (it != r.programs.end()) check = it->second.check;
  }
  get_rl_program(name);  // throws with the known names
  if (check) check(config);
}

std::vector<std::string> rl_program_names() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<std::string> names;
  for (const auto& entry : r.programs) names.push_back(entry.first);
  return names;
}

// The run spec resolves it, where every algorithm key is read (run_spec_builders.cpp).
std::string rl_program_name(const Config& config) { return build_run_spec(config).algorithm.program; }

}  // namespace hybridflow
