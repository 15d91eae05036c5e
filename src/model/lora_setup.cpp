#include "hybridflow/model/lora_setup.h"

#include "hybridflow/core/error.h"
#include "hybridflow/model/lora.h"

namespace hybridflow {

void add_configured_lora(CausalLM& model, const LoraConfig& lora, const std::string& adapter_path, uint64_t seed,
                         const std::string& section) {
  if (!lora.enabled() && adapter_path.empty()) return;
  const std::string prefix = section + ".";
  if (!adapter_path.empty()) {
    HF_CHECK(!model->pipeline_stage().enabled(), prefix, "lora_adapter_path: starting from an adapter directory is ",
             "not supported with pipeline stages (a stage holds only its layers' adapters)");
    try {
      load_lora_adapter(adapter_path, model);
    } catch (const Error& e) {
      HF_FAIL(prefix, "lora_adapter_path = ", adapter_path, ": ", e.what());
    }
  } else {
    lora_target_paths(*model, lora, prefix);  // its checks, naming the keys
    model->add_lora(lora, seed);
  }
  auto params = model->named_parameters();
  if (torch::Tensor* value_head = model->head_kind() == HeadKind::kValue ? params.find("score.weight") : nullptr)
    value_head->set_requires_grad(true);
}

}  // namespace hybridflow
