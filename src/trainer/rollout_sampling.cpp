#include "hybridflow/trainer/rollout_sampling.h"

#include <algorithm>
#include <filesystem>

#include "hybridflow/core/error.h"
#include "hybridflow/model/pretrained.h"
#include "hybridflow/text/generation_config.h"

namespace hybridflow {

int64_t top_k_from_config(int64_t value, const std::string& key) {
  HF_CHECK(value >= -1, key, " must be >= 0, or -1 / 0 for off (verl's -1), got ", value);
  return std::max<int64_t>(0, value);
}

RolloutSampling resolve_rollout_sampling(const Config& rollout, const std::string& model_dir, int64_t tokenizer_eos) {
  text::GenerationDefaults defaults;
  const std::string file = model_dir.empty() ? std::string() : model_dir + "/generation_config.json";
  const bool have_file = !file.empty() && std::filesystem::exists(file);
  if (have_file) defaults = text::GenerationDefaults::load(file);

  RolloutSampling s;
  std::vector<std::string> from_file;
  // verl writes top_k = -1 for "off"; transformers' generation_config uses 0 (or leaves it out).
  if (!rollout.is_null("temperature")) {
    s.temperature = rollout.get<double>("temperature");
  } else if (defaults.temperature) {
    s.temperature = *defaults.temperature;
    from_file.push_back("temperature");
  }
  if (!rollout.is_null("top_k")) {
    s.top_k = top_k_from_config(rollout.get<int64_t>("top_k"), "actor_rollout_ref.rollout.top_k");
  } else if (defaults.top_k) {
    s.top_k = *defaults.top_k;
    from_file.push_back("top_k");
    HF_CHECK(s.top_k >= 0, file, ": key 'top_k' must be >= 0, got ", s.top_k);
  }
  if (!rollout.is_null("top_p")) {
    s.top_p = rollout.get<double>("top_p");
  } else if (defaults.top_p) {
    s.top_p = *defaults.top_p;
    from_file.push_back("top_p");
  }
  // Each check names where its value came from: the config key or the file's key.
  auto origin = [&](const std::string& key) {
    return std::find(from_file.begin(), from_file.end(), key) != from_file.end()
               ? file + ": key '" + key + "'"
               : "actor_rollout_ref.rollout." + key;
  };
  HF_CHECK(s.temperature > 0, origin("temperature"), " must be > 0 (rollouts sample), got ", s.temperature);
  HF_CHECK(s.top_p > 0 && s.top_p <= 1, origin("top_p"), " must be in (0, 1], got ", s.top_p);

  s.eos_token_ids = generation_stop_ids(defaults.eos_token_ids, tokenizer_eos);  // the file read above
  s.source = "config";
  if (!from_file.empty()) {
    s.source = file + " (";
    for (size_t i = 0; i < from_file.size(); ++i) s.source += (i ? ", " : "") + from_file[i];
    s.source += ")";
  }
  return s;
}

}  // namespace hybridflow
