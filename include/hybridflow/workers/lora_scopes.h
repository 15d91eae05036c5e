// Scoped LoRA switches the RL roles use around a call: adapters merged into the weights for generation
// (actor_rollout_ref.rollout.lora_merge), and adapters switched off for the reference policy. Both restore
// the model exactly when the scope ends (CausalLM::unmerge_lora restores the weights bit for bit).
#pragma once

#include "hybridflow/model/transformer.h"

namespace hybridflow {

// Merges `model`'s adapters while alive when `merge` is set and it has adapters; otherwise does nothing.
class MergedLoraScope {
 public:
  MergedLoraScope(CausalLM& model, bool merge) : model_(model), merged_(merge && model->has_lora()) {
    if (merged_) model_->merge_lora();
  }
  ~MergedLoraScope() {
    if (merged_) model_->unmerge_lora();
  }
  MergedLoraScope(const MergedLoraScope&) = delete;
  MergedLoraScope& operator=(const MergedLoraScope&) = delete;

 private:
  CausalLM& model_;
  bool merged_;
};

// Switches `model`'s adapters off while alive: the base model.
class LoraDisabledScope {
 public:
  explicit LoraDisabledScope(CausalLM& model) : model_(model) { model_->set_lora_enabled(false); }
  ~LoraDisabledScope() { model_->set_lora_enabled(true); }
  LoraDisabledScope(const LoraDisabledScope&) = delete;
  LoraDisabledScope& operator=(const LoraDisabledScope&) = delete;

 private:
  CausalLM& model_;
};

}  // namespace hybridflow
