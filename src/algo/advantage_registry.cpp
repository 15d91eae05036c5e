#include <algorithm>
#include <map>
#include <mutex>
#include <sstream>

#include "hybridflow/algo/advantage.h"
#include "hybridflow/core/error.h"

namespace hybridflow::algo {
namespace {

// Built-ins are inserted here rather than by static registrar objects: a static library drops object files
// nobody references, and their registrations with them.
struct Registry {
  std::mutex mutex;
  std::map<std::string, AdvantageEstimator> estimators{
      {"gae", compute_gae_advantage},
      {"grpo", compute_grpo_advantage},
      {"rloo", compute_rloo_advantage},
      {"remax", compute_remax_advantage},
      {"reinforce_plus_plus", compute_reinforce_plus_plus_advantage},
      {"reinforce_plus_plus_baseline", compute_reinforce_plus_plus_baseline_advantage},
      {"gpg", compute_gpg_advantage},
      {"optimal_token_baseline", compute_optimal_token_baseline_advantage},
      {"tir_optimal_token_baseline", compute_tir_optimal_token_baseline_advantage},
  };
};

Registry& registry() {
  static Registry instance;
  return instance;
}

}  // namespace

void register_advantage_estimator(const std::string& name, AdvantageEstimator fn) {
  HF_CHECK(!name.empty(), "algo: advantage estimator name must not be empty");
  HF_CHECK(static_cast<bool>(fn), "algo: advantage estimator '", name, "' has no function");
  auto& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  reg.estimators[name] = std::move(fn);
}

bool has_advantage_estimator(const std::string& name) {
  auto& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  return reg.estimators.count(name) > 0;
}

std::vector<std::string> advantage_estimator_names() {
  auto& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  std::vector<std::string> names;
  for (const auto& entry : reg.estimators) names.push_back(entry.first);
  return names;  // std::map keeps them sorted
}

AdvantageEstimator get_advantage_estimator(const std::string& name) {
  auto& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  auto it = reg.estimators.find(name);
  if (it == reg.estimators.end()) {
    std::ostringstream known;
    for (const auto& entry : reg.estimators) known << (known.tellp() > 0 ? ", " : "") << entry.first;
    HF_FAIL("algo: unknown adv_estimator '", name, "' (known: ", known.str(), ")");
  }
  return it->second;
}

AdvantageOutput compute_advantage(const std::string& name, const AdvantageInput& input) {
  return get_advantage_estimator(name)(input);
}

}  // namespace hybridflow::algo
