#include "config_entry.h"

#include <cmath>
#include <filesystem>

#include "hybridflow/core/config.h"
#include "hybridflow/core/error.h"
#include "hybridflow/core/fs.h"

namespace hybridflow::agent {
namespace config_entry_detail {

std::string line_of(const YAML::Node& node) {
  const YAML::Mark mark = node.Mark();
  return mark.line >= 0 ? " (line " + std::to_string(mark.line + 1) + ")" : "";
}

std::string scalar_text(const YAML::Node& node) { return node.IsScalar() ? node.Scalar() : "a " + std::string(node.IsMap() ? "map" : node.IsSequence() ? "list" : "null"); }

}  // namespace config_entry_detail

using namespace config_entry_detail;

Json yaml_to_json(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      return nullptr;
    case YAML::NodeType::Sequence: {
      Json out = Json::array();
      for (const auto& item : node) out.push_back(yaml_to_json(item));
      return out;
    }
    case YAML::NodeType::Map: {
      Json out = Json::object();
      for (const auto& kv : node) out[kv.first.as<std::string>()] = yaml_to_json(kv.second);
      return out;
    }
    case YAML::NodeType::Scalar:
      break;
  }
  const std::string& text = node.Scalar();
  if (node.Tag() == "!") return text;  // quoted: a string whatever it looks like
  if (text == "null" || text == "Null" || text == "NULL" || text == "~") return nullptr;
  if (text == "true" || text == "True" || text == "TRUE") return true;
  if (text == "false" || text == "False" || text == "FALSE") return false;
  try {
    size_t used = 0;
    long long i = std::stoll(text, &used, 10);
    if (used == text.size()) return i;
  } catch (const std::exception&) {
  }
  try {
    size_t used = 0;
    double d = std::stod(text, &used);
    bool looks_numeric = text.find_first_not_of("0123456789+-.eE") == std::string::npos;
    if (used == text.size() && looks_numeric && std::isfinite(d)) return d;
  } catch (const std::exception&) {
  }
  return text;
}

YAML::Node parse_config_yaml(const std::string& text, const std::string& source_name) {
  try {
    return YAML::Load(text);
  } catch (const YAML::Exception& e) {
    HF_FAIL(source_name, ":", e.mark.line + 1, ":", e.mark.column + 1, ": not valid YAML: ", e.msg);
  }
}

std::vector<YAML::Node> config_entries(const YAML::Node& root, const std::string& key, const std::string& source_name) {
  HF_CHECK(root.IsMap() && root[key], source_name, ": expected a map with a '", key, "' list at the top");
  const YAML::Node list = root[key];
  if (list.IsNull()) return {};
  HF_CHECK(list.IsSequence(), source_name, line_of(list), ": '", key, "' must be a list, got ", scalar_text(list));
  for (const auto& kv : root)
    HF_CHECK(kv.first.as<std::string>() == key, source_name, line_of(kv.first), ": unknown top-level key '",
             kv.first.as<std::string>(), "' (expected only '", key, "')");
  std::vector<YAML::Node> entries;
  for (const auto& item : list) entries.push_back(item);
  return entries;
}

void ConfigEntry::fail(const std::string& key, const std::string& message) const {
  YAML::Node at = !key.empty() && node_.IsMap() && node_[key] ? node_[key] : node_;
  HF_FAIL(where_, line_of(at), ": ", key.empty() ? std::string() : key_name(key) + ": ", message);
}

ConfigEntry ConfigEntry::config_of_kind(const std::string& kinds) const {
  if (!has("config")) {
    std::string class_name = string_or("class_name", "");
    fail("config", "missing: expected config.type (" + kinds + ")" +
                       (class_name.empty() ? std::string()
                                           : "; class_name '" + class_name + "' names a Python class, which hybridflow "
                                                                             "cannot run"));
  }
  return map("config");
}

bool ConfigEntry::has(const std::string& key) const { return node_.IsMap() && node_[key] && !node_[key].IsNull(); }

ConfigEntry ConfigEntry::map(const std::string& key) const {
  if (!has(key)) fail(key, "missing (expected a map)");
  if (!node_[key].IsMap()) fail(key, "expected a map, got " + scalar_text(node_[key]));
  ConfigEntry sub(node_[key], where_);
  sub.prefix_ = key_name(key) + ".";
  return sub;
}

std::string ConfigEntry::string(const std::string& key) const {
  if (!has(key)) fail(key, "missing (expected a string)");
  if (!node_[key].IsScalar()) fail(key, "expected a string, got " + scalar_text(node_[key]));
  return node_[key].Scalar();
}

std::string ConfigEntry::string_or(const std::string& key, const std::string& fallback) const {
  return has(key) ? string(key) : fallback;
}

double ConfigEntry::number_or(const std::string& key, double fallback) const {
  if (!has(key)) return fallback;
  Json value = yaml_to_json(node_[key]);
  if (!value.is_number()) fail(key, "expected a number, got '" + scalar_text(node_[key]) + "'");
  return value.get<double>();
}

int64_t ConfigEntry::integer_or(const std::string& key, int64_t fallback) const {
  if (!has(key)) return fallback;
  Json value = yaml_to_json(node_[key]);
  if (!value.is_number_integer()) fail(key, "expected an integer, got '" + scalar_text(node_[key]) + "'");
  return value.get<int64_t>();
}

std::vector<std::string> ConfigEntry::strings_or(const std::string& key, const std::vector<std::string>& fallback) const {
  if (!has(key)) return fallback;
  if (!node_[key].IsSequence()) fail(key, "expected a list of strings, got " + scalar_text(node_[key]));
  std::vector<std::string> out;
  for (const auto& item : node_[key]) {
    if (!item.IsScalar()) fail(key, "expected a list of strings, found " + scalar_text(item) + " in it");
    out.push_back(item.Scalar());
  }
  return out;
}

std::vector<std::string> ConfigEntry::command(const std::string& key) const {
  if (!has(key)) fail(key, "missing (expected a command: a list [program, args...] or a shell line)");
  if (node_[key].IsScalar()) {
    std::string line = node_[key].Scalar();
    if (line.find_first_not_of(" \t") == std::string::npos) fail(key, "expected a command, got an empty string");
    return {"/bin/sh", "-c", line};
  }
  std::vector<std::string> argv = strings_or(key, {});
  if (argv.empty() || argv[0].empty()) fail(key, "expected a non-empty list [program, args...]");
  return argv;
}

void ConfigEntry::check_keys(const std::set<std::string>& allowed) const {
  for (const auto& kv : node_) {
    std::string key = kv.first.as<std::string>();
    if (allowed.count(key)) continue;
    std::string closest;
    size_t best = 3;
    for (const auto& a : allowed) {
      // A typo, or a shortened name ("attempts" for "max_attempts").
      size_t d = a.find(key) != std::string::npos || key.find(a) != std::string::npos ? 1 : edit_distance(key, a);
      if (d < best) best = d, closest = a;
    }
    std::string known;
    for (const auto& a : allowed) known += (known.empty() ? "" : ", ") + a;
    HF_FAIL(where_, line_of(kv.first), ": unknown key '", key_name(key), "'",
            closest.empty() ? "" : "; did you mean '" + key_name(closest) + "'?", " (known: ", known, ")");
  }
}

ConfigFile read_config_file(const std::string& path, const std::string& what) {
  ConfigFile file;
  try {
    file.text = read_file(path);
  } catch (const Error& e) {
    HF_FAIL(what, " '", path, "': ", e.what());
  }
  file.base_dir = std::filesystem::path(path).parent_path().string();
  if (file.base_dir.empty()) file.base_dir = ".";
  return file;
}

std::string resolve_config_path(const std::string& path, const std::string& base_dir) {
  if (path.empty() || path[0] == '/' || base_dir.empty()) return path;
  return (std::filesystem::path(base_dir) / path).lexically_normal().string();
}

}  // namespace hybridflow::agent
