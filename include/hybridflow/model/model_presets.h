// The named model shapes: small test shapes whose vocabulary is the tokenizer's, and published architectures
// with their config.json numbers (vocabulary included), given random weights by `hybridflow init --preset`
// and `hybridflow bench --preset`. The placement planner's presets (placement/model_shape.h) are the
// published entries of this table, so a name means the same shape to every command.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "hybridflow/model/model_config.h"

namespace hybridflow {

struct ModelPreset {
  std::string name;    // "qwen3-0.6b"
  std::string source;  // where the numbers come from ("Qwen/Qwen3-0.6B config.json") or what the shape is for
  // A published architecture: every field is its config.json's, vocab_size included. Otherwise a test shape
  // that takes the tokenizer's vocabulary.
  bool published = false;
  ModelConfig config;  // vocab_size 0 for test shapes
};

// Every preset, test shapes first, then the published ones from small to large.
const std::vector<ModelPreset>& model_presets();
// "tiny, small, ..., qwen2.5-72b" (published_only: only the published names), for help texts and errors.
std::string model_preset_list(bool published_only = false);
// The preset of that name, or nullopt.
std::optional<ModelPreset> find_model_preset(const std::string& name);

}  // namespace hybridflow
