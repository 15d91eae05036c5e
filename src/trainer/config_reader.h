// Internal to trainer/: a Config seen through the role spec that reads it. Every key read (value or null
// test) is noted in the spec's key set, so the keys each role spec consumes are known from the code that
// consumes them (tests/trainer/test_role_spec_keys.cpp holds them against docs/configuration.md).
#pragma once

#include <set>
#include <string>

#include "hybridflow/core/config.h"

namespace hybridflow {

class ConfigReader {
 public:
  // `reads` (may be null: nothing noted) collects the full dotted keys read.
  ConfigReader(const Config& config, std::set<std::string>* reads = nullptr) : config_(config), reads_(reads) {}

  template <typename T>
  T get(const std::string& key) const {
    note(key);
    return config_.get<T>(key);
  }
  bool is_null(const std::string& key) const {
    note(key);
    return config_.is_null(key);
  }
  ConfigReader subtree(const std::string& key) const { return ConfigReader(config_.subtree(key), reads_); }
  // For a key read by a function that takes the Config itself (resolve_rollout_sampling).
  void note(const std::string& key) const {
    if (reads_) reads_->insert(config_.prefix().empty() ? key : config_.prefix() + "." + key);
  }
  const Config& config() const { return config_; }

 private:
  Config config_;
  std::set<std::string>* reads_;
};

}  // namespace hybridflow
