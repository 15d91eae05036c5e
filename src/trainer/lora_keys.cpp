#include "hybridflow/trainer/lora_keys.h"

#include <set>

#include "hybridflow/core/error.h"
#include "hybridflow/model/lora.h"

namespace hybridflow {
namespace {

// A list of module names, or a string: all-linear, else a regular expression (into *regex) as PEFT reads one.
std::vector<std::string> lora_key_module_names(const Config& model, const std::string& section, const std::string& key,
                                               std::vector<std::string> unset, std::string* regex) {
  if (model.is_null(key)) return unset;
  std::vector<std::string> names;
  try {
    names = model.get<std::vector<std::string>>(key);
  } catch (const Error&) {
    const std::string name = model.get<std::string>(key);
    if (name == "all-linear") return {name};
    HF_CHECK(!name.empty(), section, key, " is empty: expected all-linear, a list of module names or a regular ",
             "expression");
    *regex = name;  // checked against the model's module paths when the adapters are added (model/lora.h)
    return {};
  }
  static const std::set<std::string> kProjections = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                     "gate_proj", "up_proj", "down_proj"};
  for (const std::string& name : names) {
    if (name == "all-linear") continue;
    HF_CHECK(kProjections.count(name.substr(name.rfind('.') + 1)), section, key, ": '", name,
             "' is not a linear projection of the decoder (expected all-linear or q_proj, k_proj, v_proj, o_proj, ",
             "gate_proj, up_proj, down_proj, optionally with a path such as layers.0.self_attn.q_proj; a string ",
             "rather than a list is a regular expression over whole module paths)");
  }
  return names;
}

}  // namespace

LoraConfig read_lora_keys(const Config& model, std::string* adapter_path) {
  const std::string section = model.prefix().empty() ? "" : model.prefix() + ".";
  LoraConfig lora;
  lora.rank = model.get<int64_t>("lora_rank");
  HF_CHECK(lora.rank >= 0, section, "lora_rank must be >= 0 (0: train every weight, no LoRA), got ", lora.rank);
  lora.alpha = model.get<double>("lora_alpha");
  HF_CHECK(lora.alpha > 0, section, "lora_alpha must be > 0, got ", lora.alpha);
  lora.target_modules = lora_key_module_names(model, section, "target_modules", {"all-linear"}, &lora.target_regex);
  lora.exclude_modules = lora_key_module_names(model, section, "exclude_modules", {}, &lora.exclude_regex);
  *adapter_path = model.is_null("lora_adapter_path") ? "" : model.get<std::string>("lora_adapter_path");
  if (adapter_path->empty()) return lora;
  LoraConfig file;
  try {
    file = read_lora_adapter_config(*adapter_path);
  } catch (const Error& e) {
    HF_FAIL(section, "lora_adapter_path: ", e.what());
  }
  HF_CHECK(lora.rank == 0 || lora.rank == file.rank, section, "lora_rank = ", lora.rank, " disagrees with r = ",
           file.rank, " of ", section, "lora_adapter_path = ", *adapter_path, " (leave lora_rank 0 to take the adapter's)");
  return file;
}

}  // namespace hybridflow
