// Configuration: YAML with verl/Hydra-style dotted command-line overrides.
//
// A component declares its schema as a YAML string of defaults; the type of each default is the type
// the key expects (int, float, bool, string, list, map). Special defaults:
//   key: ???      required, any type; loading fails if neither the file nor the command line sets it
//   key: null     optional, any type
//   key: {}       open map: any sub-keys are accepted (e.g. free-form model kwargs)
// The user's YAML file is merged over the defaults, then overrides are applied in order, with Hydra's forms:
//   actor.optim.lr=1e-5   data.files=[a.jsonl,b.jsonl]   key=null (null)   key= (the empty string)
//   +open.new_key=1   adds a key to an open map (an error where the key exists or the map is not open)
//   ++key=1           sets the key, or adds it where an open map allows
// Unknown keys, wrong types and missing required keys throw hybridflow::Error naming the dotted key,
// where it came from (file:line:column or "command line") and, for unknown keys, the closest valid key.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace hybridflow {

// Another tool's names for a schema (verl's for the RL trainer): keys the schema lacks that are read as
// one of its keys, or accepted and dropped. Consulted only where the schema lacks the user's key, so a
// key the schema gains later simply stops being foreign.
struct KeyCompat {
  // (user key, schema key): the user's value is set at the schema key. Skipped when the schema lacks the
  // target; a null value means "unset" and restores the schema's default.
  std::vector<std::pair<std::string, std::string>> aliases;
  struct Ignored {
    std::string key;       // a dotted key, or a subtree: every key below it
    std::string accepted;  // "" = any value; else the '|'-separated values allowed (compared case-insensitively)
    std::string note;      // why the key has no effect here; shown when a value is refused
  };
  std::vector<Ignored> ignored;
  // verl writes null for "unset": a null for a key whose default has a type keeps that default.
  bool null_keeps_default = false;
};

// What loading with a KeyCompat did, for the caller to report once.
struct CompatReport {
  std::vector<std::string> ignored;                          // dotted keys set by the user and dropped
  std::vector<std::pair<std::string, std::string>> renamed;  // (user key, schema key) that were applied
};

struct ConfigAccess;

class Config {
 public:
  Config();  // an empty config (no keys)

  // defaults_yaml: the schema with defaults; user_file: a YAML file path, or "" for none.
  static Config load(const std::string& defaults_yaml, const std::string& user_file,
                     const std::vector<std::string>& overrides);
  // Same, with the user's YAML given as text; `source_name` names it in error messages.
  static Config load_from_string(const std::string& defaults_yaml, const std::string& user_yaml,
                                 const std::string& source_name, const std::vector<std::string>& overrides);
  // The same, also reading the keys `compat` knows; `report` (may be null) says which it met.
  static Config load(const std::string& defaults_yaml, const std::string& user_file,
                     const std::vector<std::string>& overrides, const KeyCompat& compat, CompatReport* report);
  static Config load_from_string(const std::string& defaults_yaml, const std::string& user_yaml,
                                 const std::string& source_name, const std::vector<std::string>& overrides,
                                 const KeyCompat& compat, CompatReport* report);

  // Typed access by dotted key. Supported T: double, int64_t, int, bool, std::string,
  // std::vector<std::string>, std::vector<int64_t>, std::vector<double>.
  // Missing key -> Error with the closest valid key; value of another type -> Error naming both.
  template <typename T>
  T get(const std::string& key) const;
  template <typename T>
  T get_or(const std::string& key, const T& fallback) const {
    return has(key) && !is_null(key) ? get<T>(key) : fallback;
  }

  bool has(const std::string& key) const;
  bool is_null(const std::string& key) const;  // false for missing keys
  // Where the key's value came from: "defaults:3:5", "file.yaml:7:3", "command line: key=value".
  std::string origin(const std::string& key) const;
  bool is_default(const std::string& key) const;  // the value is the schema's default (origin "defaults...")
  // The map under `key` as its own Config; error messages keep the full dotted key.
  Config subtree(const std::string& key) const;
  // Direct child keys of the root of this config, in document order.
  std::vector<std::string> keys() const;
  // The resolved config as YAML, to be saved next to checkpoints (loadable again as a user file).
  std::string to_yaml() const;
  // Prefix of this config within the config it was taken from ("" for a root, "actor" for subtree("actor")).
  const std::string& prefix() const;

  struct Impl;

 private:
  friend struct ConfigAccess;  // config.cpp's readers of the value tree (config_json.h)
  explicit Config(std::shared_ptr<const Impl> impl);
  std::shared_ptr<const Impl> impl_;
};

template <> int64_t Config::get<int64_t>(const std::string& key) const;
template <> int Config::get<int>(const std::string& key) const;
template <> double Config::get<double>(const std::string& key) const;
template <> bool Config::get<bool>(const std::string& key) const;
template <> std::string Config::get<std::string>(const std::string& key) const;
template <> std::vector<std::string> Config::get<std::vector<std::string>>(const std::string& key) const;
template <> std::vector<int64_t> Config::get<std::vector<int64_t>>(const std::string& key) const;
template <> std::vector<double> Config::get<std::vector<double>>(const std::string& key) const;

// Levenshtein distance (insertions, deletions, substitutions each cost 1).
size_t edit_distance(const std::string& a, const std::string& b);

}  // namespace hybridflow
