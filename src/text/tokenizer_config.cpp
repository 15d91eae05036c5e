#include "hybridflow/text/tokenizer_config.h"

#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "hybridflow/core/error.h"

namespace hybridflow::text {
namespace {

constexpr const char* kSpecialTokenKeys[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                             "pad_token", "cls_token", "mask_token"};

[[noreturn]] void bad_key(const std::string& source, const std::string& key, const std::string& expected,
                          const nlohmann::ordered_json& got) {
  HF_FAIL(source, ": key '", key, "' must be ", expected, ", got ", got.type_name(), " ", got.dump());
}

// A special token is a string, or an AddedToken written as {"content": "...", ...}.
std::optional<std::string> read_token(const nlohmann::ordered_json& json, const std::string& source, const char* key) {
  auto it = json.find(key);
  if (it == json.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    auto content = it->find("content");
    if (content != it->end() && content->is_string()) return content->get<std::string>();
  }
  bad_key(source, key, "a string or an object with a string \"content\"", *it);
}

std::optional<bool> read_bool(const nlohmann::ordered_json& json, const std::string& source, const char* key) {
  auto it = json.find(key);
  if (it == json.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean()) bad_key(source, key, "true or false", *it);
  return it->get<bool>();
}

std::string read_text_file(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  HF_CHECK(in, "cannot open ", what, " ", path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

TokenizerConfig TokenizerConfig::from_json(const nlohmann::ordered_json& json, const std::string& source) {
  HF_CHECK(json.is_object(), source, ": expected a JSON object, got ", json.type_name());
  TokenizerConfig c;
  c.source = source;
  if (auto it = json.find("chat_template"); it != json.end() && !it->is_null()) {
    if (it->is_string()) {
      c.chat_template = it->get<std::string>();
    } else if (it->is_array()) {
      for (size_t i = 0; i < it->size(); ++i) {
        const auto& entry = (*it)[i];
        const std::string where = "chat_template[" + std::to_string(i) + "]";
        if (!entry.is_object() || !entry.contains("name") || !entry.contains("template") || !entry["name"].is_string() ||
            !entry["template"].is_string())
          bad_key(source, where, "an object with string \"name\" and \"template\"", entry);
        c.named_chat_templates[entry["name"].get<std::string>()] = entry["template"].get<std::string>();
      }
      auto def = c.named_chat_templates.find("default");
      if (def != c.named_chat_templates.end()) c.chat_template = def->second;
    } else {
      bad_key(source, "chat_template", "a string or a list of {\"name\", \"template\"} objects", *it);
    }
  }
  std::optional<std::string>* tokens[] = {&c.bos_token, &c.eos_token, &c.unk_token, &c.sep_token,
                                          &c.pad_token, &c.cls_token, &c.mask_token};
  for (size_t i = 0; i < std::size(kSpecialTokenKeys); ++i) *tokens[i] = read_token(json, source, kSpecialTokenKeys[i]);
  c.add_bos_token = read_bool(json, source, "add_bos_token");
  c.add_eos_token = read_bool(json, source, "add_eos_token");
  if (auto it = json.find("model_max_length"); it != json.end() && !it->is_null()) {
    if (it->is_number_integer()) {
      if (it->is_number_unsigned() && it->get<std::uint64_t>() > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
        c.model_max_length = std::nullopt;
      } else {
        c.model_max_length = it->get<std::int64_t>();
      }
    } else if (it->is_number_float() && it->get<double>() >= 9.2e18) {
      c.model_max_length = std::nullopt;  // int(1e30), which JSON readers see as a float: no limit
    } else {
      bad_key(source, "model_max_length", "an integer", *it);
    }
    if (c.model_max_length && *c.model_max_length <= 0) bad_key(source, "model_max_length", "positive", *it);
  }
  return c;
}

TokenizerConfig TokenizerConfig::load(const std::string& path) {
  nlohmann::ordered_json json;
  try {
    json = nlohmann::ordered_json::parse(read_text_file(path, "tokenizer config"));
  } catch (const nlohmann::json::parse_error& e) {
    HF_FAIL(path, ": not valid JSON (", e.what(), ")");
  }
  TokenizerConfig c = from_json(json, path);
  const auto jinja_file = std::filesystem::path(path).parent_path() / "chat_template.jinja";
  if (std::filesystem::exists(jinja_file)) c.chat_template = read_text_file(jinja_file.string(), "chat template");
  return c;
}

void TokenizerConfig::replace_chat_template(std::string source) {
  chat_template = std::move(source);
  named_chat_templates.clear();
}

const std::string& TokenizerConfig::template_for(bool with_tools) const {
  if (!named_chat_templates.empty()) {
    if (with_tools) {
      auto it = named_chat_templates.find("tool_use");
      if (it != named_chat_templates.end()) return it->second;
    }
    HF_CHECK(chat_template, source, ": has several chat templates and none named \"default\"");
    return *chat_template;
  }
  HF_CHECK(chat_template, source, ": has no chat_template");
  return *chat_template;
}

nlohmann::ordered_json TokenizerConfig::special_token_variables() const {
  nlohmann::ordered_json vars = nlohmann::ordered_json::object();
  const std::optional<std::string>* tokens[] = {&bos_token, &eos_token, &unk_token, &sep_token,
                                                &pad_token, &cls_token, &mask_token};
  for (size_t i = 0; i < std::size(kSpecialTokenKeys); ++i)
    if (*tokens[i]) vars[kSpecialTokenKeys[i]] = **tokens[i];
  return vars;
}

}  // namespace hybridflow::text
