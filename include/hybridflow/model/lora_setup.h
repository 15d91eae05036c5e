// LoRA as a training configuration asks for it (verl's <section>.lora_rank, lora_alpha, target_modules,
// exclude_modules, lora_adapter_path), shared by the RL roles' model specs and the fine-tuning commands.
#pragma once

#include <cstdint>
#include <string>

#include "hybridflow/model/lora_config.h"
#include "hybridflow/model/transformer.h"

namespace hybridflow {

// Adds adapters to `model` (built, in its final device and dtype): from the PEFT directory `adapter_path`
// when set (its adapter_config.json decides rank and targets), else fresh ones of `lora` drawn from `seed`
// (nothing when lora.rank is 0 and no path is set). Only the adapters train afterwards, and a value head
// (it starts untrained, like PEFT's modules_to_save for a classification head). Errors name the keys under
// `section` ("actor_rollout_ref.model.lora_rank ...").
void add_configured_lora(CausalLM& model, const LoraConfig& lora, const std::string& adapter_path, uint64_t seed,
                         const std::string& section);

}  // namespace hybridflow
