// The registry of RL programs: the built-ins of programs/ plus any a binary registers.
#include "hybridflow/trainer/rl_program.h"

#include <map>
#include <mutex>
#include <sstream>

#include "hybridflow/algo/algo_config.h"
#include "hybridflow/core/error.h"
#include "programs/programs.h"

namespace hybridflow {

namespace {

struct Registry {
  std::mutex mutex;
  std::map<std::string, RLProgram> programs;
};

// Built-ins are listed here rather than registered by static objects: a static library drops objects
// that nothing references, and their registrations with them.
Registry& registry() {
  static Registry* r = [] {
    auto* reg = new Registry;
    reg->programs = {{"ppo", programs::ppo},
                     {"grpo", programs::grpo},
                     {"rloo", programs::rloo},
                     {"remax", programs::remax},
                     {"reinforce_plus_plus", programs::reinforce_plus_plus},
                     {"safe_rlhf", programs::safe_rlhf},
                     {"dapo", programs::dapo},
                     {"policy_gradient", programs::policy_gradient}};
    return reg;
  }();
  return *r;
}

}  // namespace

void register_rl_program(const std::string& name, RLProgram program) {
  HF_CHECK(!name.empty() && name != "auto", "register_rl_program: the name must be non-empty and not 'auto'");
  HF_CHECK(static_cast<bool>(program), "register_rl_program: program '", name, "' has no function");
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.programs[name] = std::move(program);
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
  return it->second;
}

std::vector<std::string> rl_program_names() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<std::string> names;
  for (const auto& entry : r.programs) names.push_back(entry.first);
  return names;
}

std::string rl_program_name(const Config& config) {
  const std::string name = config.get<std::string>("algorithm.program");
  if (name != "auto") {
    get_rl_program(name);  // throws with the known names
    return name;
  }
  if (config.get<bool>("cost_model.enable") || config.get<std::string>("cost.type") != "none") return "safe_rlhf";
  if (config.get<bool>("algorithm.filter_groups.enable")) return "dapo";
  const std::string estimator = algo::advantage_estimator_name(config.subtree("algorithm"));
  if (estimator == "gae") return "ppo";
  const auto names = rl_program_names();
  return std::find(names.begin(), names.end(), estimator) != names.end() ? estimator : "policy_gradient";
}

}  // namespace hybridflow
