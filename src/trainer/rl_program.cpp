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

struct RegisteredProgram {
  RLProgram run;
  RLProgramCheck check;  // may be empty
};

struct Registry {
  std::mutex mutex;
  std::map<std::string, RegisteredProgram> programs;
};

// DAPO filters on the sequence score before the rollout's log-probs are computed, and generates only
// sampled rounds.
void check_dapo_program_config(const Config& c) {
  HF_CHECK(c.get<std::string>("algorithm.adv_estimator") != "remax",
           "algorithm.adv_estimator: remax needs greedy baselines that dapo's dynamic sampling ",
           "(algorithm.filter_groups.enable) does not generate; use grpo, rloo or reinforce_plus_plus");
  if (!c.is_null("algorithm.filter_groups.metric")) {
    // Every score here is one number per sequence (rule + reward model + overlong penalty): verl's acc,
    // score and seq_reward name it; seq_final_reward (after the KL penalty) is not computed before filtering.
    const std::string metric = c.get<std::string>("algorithm.filter_groups.metric");
    HF_CHECK(metric == "acc" || metric == "score" || metric == "seq_reward",
             "algorithm.filter_groups.metric: expected acc, score or seq_reward (all the sequence score), got '",
             metric, "'");
  }
}

void check_safe_rlhf_program_config(const Config& c) {
  HF_CHECK(c.get<bool>("cost_model.enable") || c.get<std::string>("cost.type") != "none",
           "algorithm.program: safe_rlhf needs a cost: set cost_model.enable or cost.type");
}

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
                     {"safe_rlhf", {programs::safe_rlhf, check_safe_rlhf_program_config}},
                     {"dapo", {programs::dapo, check_dapo_program_config}}};
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
