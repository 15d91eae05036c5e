#include "hybridflow/text/generation_config.h"

#include <fstream>
#include <sstream>

#include "hybridflow/core/error.h"

namespace hybridflow::text {
namespace {

[[noreturn]] void bad_key(const std::string& source, const std::string& key, const std::string& expected,
                          const nlohmann::ordered_json& got) {
  HF_FAIL(source, ": key '", key, "' must be ", expected, ", got ", got.type_name(), " ", got.dump());
}

const nlohmann::ordered_json* present(const nlohmann::ordered_json& json, const char* key) {
  auto it = json.find(key);
  return it == json.end() || it->is_null() ? nullptr : &*it;
}

std::optional<std::int64_t> read_int(const nlohmann::ordered_json& json, const std::string& source, const char* key,
                                     std::int64_t min_value) {
  const auto* v = present(json, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_number_integer() || v->get<std::int64_t>() < min_value)
    bad_key(source, key, "an integer >= " + std::to_string(min_value), *v);
  return v->get<std::int64_t>();
}

std::optional<double> read_number(const nlohmann::ordered_json& json, const std::string& source, const char* key) {
  const auto* v = present(json, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_number() || v->get<double>() < 0) bad_key(source, key, "a non-negative number", *v);
  return v->get<double>();
}

}  // namespace

GenerationDefaults GenerationDefaults::from_json(const nlohmann::ordered_json& json, const std::string& source) {
  HF_CHECK(json.is_object(), source, ": expected a JSON object, got ", json.type_name());
  GenerationDefaults g;
  if (const auto* eos = present(json, "eos_token_id")) {
    if (eos->is_number_integer() && eos->get<std::int64_t>() >= 0) {
      g.eos_token_ids.push_back(eos->get<std::int64_t>());
    } else if (eos->is_array()) {
      for (const auto& id : *eos) {
        if (!id.is_number_integer() || id.get<std::int64_t>() < 0)
          bad_key(source, "eos_token_id", "a token id or a list of token ids", *eos);
        g.eos_token_ids.push_back(id.get<std::int64_t>());
      }
    } else {
      bad_key(source, "eos_token_id", "a token id or a list of token ids", *eos);
    }
  }
  g.bos_token_id = read_int(json, source, "bos_token_id", 0);
  g.pad_token_id = read_int(json, source, "pad_token_id", 0);
  if (const auto* v = present(json, "do_sample")) {
    if (!v->is_boolean()) bad_key(source, "do_sample", "true or false", *v);
    g.do_sample = v->get<bool>();
  }
  g.temperature = read_number(json, source, "temperature");
  g.top_p = read_number(json, source, "top_p");
  if (g.top_p && *g.top_p > 1.0) bad_key(source, "top_p", "in [0, 1]", json["top_p"]);
  g.top_k = read_int(json, source, "top_k", 0);
  g.max_new_tokens = read_int(json, source, "max_new_tokens", 1);
  g.max_length = read_int(json, source, "max_length", 1);
  return g;
}

GenerationDefaults GenerationDefaults::load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  HF_CHECK(in, "cannot open generation config ", path);
  std::ostringstream ss;
  ss << in.rdbuf();
  nlohmann::ordered_json json;
  try {
    json = nlohmann::ordered_json::parse(ss.str());
  } catch (const nlohmann::json::parse_error& e) {
    HF_FAIL(path, ": not valid JSON (", e.what(), ")");
  }
  return from_json(json, path);
}

}  // namespace hybridflow::text
