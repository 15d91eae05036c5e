// Reading the tool and interaction config files: YAML nodes as JSON, and typed keys of one list entry
// with errors that name the file, the line, the entry and the key.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "hybridflow/agent/tool.h"

namespace hybridflow::agent {

// YAML to JSON keeping key order; plain scalars become null/bool/int/float where YAML 1.2 reads them so,
// quoted ones stay strings.
Json yaml_to_json(const YAML::Node& node);

// The YAML document of `text`; a syntax error names `source_name` and the line.
YAML::Node parse_config_yaml(const std::string& text, const std::string& source_name);

// The list under `key` of a config document's root map (verl's `tools:` / `interaction:`).
std::vector<YAML::Node> config_entries(const YAML::Node& root, const std::string& key, const std::string& source_name);

// One entry's map, read with errors naming where it is.
class ConfigEntry {
 public:
  ConfigEntry(YAML::Node node, std::string where) : node_(std::move(node)), where_(std::move(where)) {}
  const std::string& where() const { return where_; }
  const YAML::Node& node() const { return node_; }
  bool has(const std::string& key) const;
  // The sub-map `key` (with "key." prefixed to later keys' names); an Error when it is not a map.
  ConfigEntry map(const std::string& key) const;
  std::string string(const std::string& key) const;  // required
  std::string string_or(const std::string& key, const std::string& fallback) const;
  double number_or(const std::string& key, double fallback) const;
  int64_t integer_or(const std::string& key, int64_t fallback) const;
  std::vector<std::string> strings_or(const std::string& key, const std::vector<std::string>& fallback) const;
  // A command: a list (argv) or a string (run by /bin/sh -c).
  std::vector<std::string> command(const std::string& key) const;
  // Errors for keys outside `allowed`, naming the closest allowed one.
  void check_keys(const std::set<std::string>& allowed) const;
  [[noreturn]] void fail(const std::string& key, const std::string& message) const;
  // The entry's `config` map, whose `type` is one of `kinds` ("command, http or answer_check" in messages);
  // a missing one is an Error that points out a verl class_name hybridflow cannot run.
  ConfigEntry config_of_kind(const std::string& kinds) const;

 private:
  std::string key_name(const std::string& key) const { return prefix_ + key; }
  YAML::Node node_;
  std::string where_;
  std::string prefix_;
};

struct ConfigFile {
  std::string text;
  std::string base_dir;  // its directory ("." for a bare name)
};
// Reads a config file; an unreadable one is an Error naming `what` ("tool config") and the path.
ConfigFile read_config_file(const std::string& path, const std::string& what);

// `path` resolved against the config file's directory when relative.
std::string resolve_config_path(const std::string& path, const std::string& base_dir);

}  // namespace hybridflow::agent
