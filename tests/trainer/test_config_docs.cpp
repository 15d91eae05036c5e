// docs/configuration.md shows the `hybridflow train` schema as one YAML block; users copy it, so every
// key and default there must be the trainer's own. A key added to the schema without the docs (or the
// other way round) fails here, naming the key.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "hybridflow/trainer/rl_trainer.h"

namespace {

// Leaves of a YAML tree as dotted key -> scalar text ("[...]" for sequences, "~" for null).
void flatten(const YAML::Node& node, const std::string& prefix, std::map<std::string, std::string>* out) {
  if (node.IsMap()) {
    for (const auto& kv : node) {
      const std::string key = kv.first.as<std::string>();
      flatten(kv.second, prefix.empty() ? key : prefix + "." + key, out);
    }
  } else if (node.IsSequence()) {
    std::string items;
    for (const auto& item : node) items += item.as<std::string>() + ",";
    (*out)[prefix] = "[" + items + "]";
  } else if (node.IsNull()) {
    (*out)[prefix] = "~";
  } else {
    (*out)[prefix] = node.as<std::string>();
  }
}

// The first ```yaml block after `heading` in the file.
std::string yaml_block_after(const std::string& path, const std::string& heading) {
  std::ifstream in(path);
  EXPECT_TRUE(in) << path;
  std::stringstream text;
  text << in.rdbuf();
  const std::string doc = text.str();
  const size_t at = doc.find(heading);
  EXPECT_NE(at, std::string::npos) << heading << " not found in " << path;
  const size_t open = doc.find("```yaml\n", at);
  const size_t close = doc.find("```", open + 8);
  EXPECT_TRUE(open != std::string::npos && close != std::string::npos) << "no yaml block after " << heading;
  return doc.substr(open + 8, close - open - 8);
}

TEST(ConfigDocs, TrainSectionMatchesTheSchemaKeyForKey) {
  const std::string path = std::string(HF_SOURCE_DIR) + "/docs/configuration.md";
  std::map<std::string, std::string> documented, schema;
  flatten(YAML::Load(yaml_block_after(path, "## `hybridflow train`")), "", &documented);
  flatten(YAML::Load(hybridflow::rl_trainer_defaults_yaml()), "", &schema);
  for (const auto& [key, value] : schema) {
    auto it = documented.find(key);
    if (it == documented.end()) {
      ADD_FAILURE() << "docs/configuration.md lacks train key '" << key << "' (default " << value << ")";
      continue;
    }
    // Numbers may be written differently (1e-5 vs 1.0e-5); compare those as numbers.
    char* end = nullptr;
    const double a = std::strtod(value.c_str(), &end);
    const bool numeric = end && *end == '\0' && !value.empty();
    if (numeric) {
      EXPECT_DOUBLE_EQ(std::strtod(it->second.c_str(), nullptr), a) << "default of '" << key << "'";
    } else {
      EXPECT_EQ(it->second, value) << "default of '" << key << "'";
    }
  }
  for (const auto& [key, value] : documented)
    EXPECT_TRUE(schema.count(key)) << "docs/configuration.md documents '" << key << "', which the schema does not have";
}

}  // namespace
