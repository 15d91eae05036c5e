// generation_config.json: the generation defaults a Hugging Face model ships (stop tokens, sampling
// settings). Only parsed here; applying them to generation is the engine's job. Errors name the file
// and the key.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace hybridflow::text {

struct GenerationDefaults {
  // eos_token_id may be one id or a list (Llama 3 instruct stops on several); empty when absent.
  std::vector<std::int64_t> eos_token_ids;
  std::optional<std::int64_t> bos_token_id, pad_token_id;
  std::optional<bool> do_sample;
  std::optional<double> temperature, top_p;
  std::optional<std::int64_t> top_k, max_new_tokens, max_length;

  // Absent and null keys stay unset; keys hybridflow does not use are ignored. `source` names the file.
  static GenerationDefaults from_json(const nlohmann::ordered_json& json, const std::string& source);
  static GenerationDefaults load(const std::string& path);
};

}  // namespace hybridflow::text
