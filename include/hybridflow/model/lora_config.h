// What LoRA adapters to add to a model (model/lora.h has the adapters' files and the full description).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace hybridflow {

struct LoraConfig {
  int64_t rank = 0;  // 0: no adapters (full fine-tuning)
  double alpha = 16.0;
  // "all-linear" (every decoder projection: q/k/v/o_proj, gate/up/down_proj; never the head) or PEFT module
  // names: a name matches a module whose path equals it or ends with "." + name ("q_proj",
  // "layers.0.self_attn.q_proj").
  std::vector<std::string> target_modules = {"all-linear"};
  std::vector<std::string> exclude_modules;  // same matching; removes modules from the targets
  // Or, as PEFT reads a string other than "all-linear", a regular expression (ECMAScript, which Python's re
  // shares for the usual patterns) that must match a module's whole path ("model.layers.0.self_attn.q_proj").
  // Set, it replaces the list of the same key, which is then empty.
  std::string target_regex;
  std::string exclude_regex;
  bool enabled() const { return rank > 0; }
};

}  // namespace hybridflow
