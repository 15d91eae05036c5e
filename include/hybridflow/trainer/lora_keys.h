// verl's LoRA keys of a model section (actor_rollout_ref.model, critic.model, and `hybridflow sft` / `rm`'s
// model): lora_rank, lora_alpha, target_modules, exclude_modules, lora_adapter_path. One reader for all.
#pragma once

#include <string>

#include "hybridflow/core/config.h"
#include "hybridflow/model/lora_config.h"

namespace hybridflow {

// The keys under `model_section` (the section's subtree, e.g. config.subtree("critic.model")), checked, as
// the adapters to add; `adapter_path` receives lora_adapter_path ("" when null). target_modules null means
// all-linear; a string other than all-linear is a regular expression over whole module paths, as PEFT reads one
// (checked against the model when the adapters are added), and each listed name must end in a decoder
// projection's name. With an adapter directory its adapter_config.json decides the
// adapters (unsupported PEFT options fail naming the key and the file); lora_rank, if also set, must agree.
// Errors name the full key.
LoraConfig read_lora_keys(const Config& model_section, std::string* adapter_path);

// The keys read_lora_keys reads, for the trainer's record of who reads what.
inline constexpr const char* kLoraKeys[] = {"lora_rank", "lora_alpha", "target_modules", "exclude_modules",
                                            "lora_adapter_path"};

}  // namespace hybridflow
