// PEFT-compatible LoRA files and target resolution (the adapters' arithmetic is in model/lora_branch.h).
#include "hybridflow/model/lora.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>
#include <optional>
#include <regex>
#include <set>

#include "hybridflow/core/error.h"
#include "hybridflow/core/fs.h"
#include "hybridflow/model/tensor_parallel_layout.h"

namespace hybridflow {
namespace {

using json = nlohmann::json;

constexpr char kPeftPrefix[] = "base_model.model.";
constexpr char kAdapterConfigFile[] = "adapter_config.json";
constexpr char kAdapterWeightsFile[] = "adapter_model.safetensors";

bool lora_name_matches(const std::string& path, const std::string& name) {
  return path == name ||
         (path.size() > name.size() && path.compare(path.size() - name.size(), name.size(), name) == 0 &&
          path[path.size() - name.size() - 1] == '.');
}

// PEFT's target_modules / exclude_modules in an adapter_config.json: null, a list of module names, or a string:
// "all-linear", else a regular expression.
void lora_modules_from_json(const json& value, const std::string& file, const std::string& key,
                            std::vector<std::string>* names, std::string* regex) {
  names->clear();
  regex->clear();
  if (value.is_null()) return;
  if (value.is_string()) {
    if (value.get<std::string>() == "all-linear")
      names->push_back("all-linear");
    else
      *regex = value.get<std::string>();
    return;
  }
  HF_CHECK(value.is_array(), file, ": ", key, " must be a list of module names, a string (all-linear or a regular ",
           "expression) or null");
  for (const auto& item : value) {
    HF_CHECK(item.is_string(), file, ": ", key, " must list module names (strings)");
    names->push_back(item.get<std::string>());
  }
}

std::optional<std::regex> module_regex(const std::string& pattern, const std::string& key) {
  if (pattern.empty()) return std::nullopt;
  try {
    return std::regex(pattern, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    HF_FAIL(key, " = '", pattern, "' is not a regular expression hybridflow can read (ECMAScript syntax): ", e.what());
  }
}

}  // namespace

bool is_lora_parameter_name(const std::string& name) {
  return name.find(".lora_A.") != std::string::npos || name.find(".lora_B.") != std::string::npos;
}

std::vector<std::string> lora_target_paths(const CausalLMImpl& model, const LoraConfig& config,
                                           const std::string& key_prefix) {
  static const std::regex projection(R"(model\.layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj))");
  // The dense projections (what hybridflow adapts) and every other module with weights of its own: the
  // embedding, the head, norms and, in a sparse layer, the experts, router and shared expert (linear layers
  // PEFT would adapt: all-linear, or a name such as gate_proj matching experts.<e>.gate_proj).
  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> projections;
  std::vector<std::string> unadapted, sparse_linears;
  const std::string block = std::string(".") + model.config().moe_block_name() + ".";
  for (const auto& item : model.named_modules()) {
    const std::string& path = item.key();
    if (std::regex_match(path, projection)) {
      projections.emplace_back(path, item.value());
    } else if (!item.value()->named_parameters(/*recurse=*/false).is_empty()) {
      unadapted.push_back(path);
      if (item.value()->as<torch::nn::Linear>() != nullptr && path.rfind("model.layers.", 0) == 0 &&
          path.find(block) != std::string::npos)
        sparse_linears.push_back(path);
    }
  }

  HF_CHECK(!config.target_modules.empty() || !config.target_regex.empty(), key_prefix,
           "target_modules is empty: expected all-linear, module names or a regular expression");
  const bool all_linear = config.target_modules.size() == 1 && config.target_modules[0] == "all-linear";
  auto check_known = [&](const std::vector<std::string>& names, const std::string& key) {
    for (const auto& name : names) {
      HF_CHECK(name != "all-linear" || (key == "target_modules" && all_linear), key_prefix, key,
               ": all-linear must stand alone in target_modules");
      if (name == "all-linear") continue;
      const bool found = std::any_of(projections.begin(), projections.end(),
                                     [&](const auto& p) { return lora_name_matches(p.first, name); });
      HF_CHECK(found, key_prefix, key, ": '", name,
               "' matches no linear projection of the model (expected all-linear or names such as q_proj, k_proj, "
               "v_proj, o_proj, gate_proj, up_proj, down_proj)");
    }
  };
  check_known(config.target_modules, "target_modules");
  check_known(config.exclude_modules, "exclude_modules");
  // hybridflow does not adapt a sparse layer's linear layers yet, so asking for them is an error rather than a
  // smaller adapter than the user meant.
  HF_CHECK(!all_linear || sparse_linears.empty(), key_prefix, "target_modules: all-linear on a mixture-of-experts ",
           "model would adapt its experts and routers too (", sparse_linears.front(), ", ...), as PEFT's does, which ",
           "hybridflow does not yet; name the projections to adapt, e.g. [q_proj, k_proj, v_proj, o_proj]");
  for (const auto& name : config.target_modules)
    for (const auto& path : sparse_linears)
      HF_CHECK(!lora_name_matches(path, name), key_prefix, "target_modules: '", name, "' matches ", path,
               " of a mixture-of-experts layer, which hybridflow does not adapt yet (PEFT would); name dense ",
               "projections only, e.g. layers.0.mlp.", name, " for a dense layer's");
  const auto target_regex = module_regex(config.target_regex, key_prefix + "target_modules");
  const auto exclude_regex = module_regex(config.exclude_regex, key_prefix + "exclude_modules");
  // PEFT would adapt whatever the expression matches; hybridflow adapts the dense projections only, so matching
  // any other module with weights of its own is an error rather than a silently smaller adapter.
  if (target_regex)
    for (const auto& path : unadapted)
      HF_CHECK(!std::regex_match(path, *target_regex), key_prefix, "target_modules = '", config.target_regex,
               "' matches ", path, ", which hybridflow does not adapt (only the decoder's dense projections ",
               "q/k/v/o_proj and gate/up/down_proj)");

  std::vector<std::string> targets;
  bool any_targeted = false;  // before the excludes
  for (const auto& [path, module] : projections) {
    auto matches_any = [&, p = path](const std::vector<std::string>& names) {
      return std::any_of(names.begin(), names.end(), [&](const std::string& n) { return lora_name_matches(p, n); });
    };
    const bool targeted = all_linear || matches_any(config.target_modules) ||
                          (target_regex && std::regex_match(path, *target_regex));
    if (!targeted) continue;
    any_targeted = true;
    if (matches_any(config.exclude_modules) || (exclude_regex && std::regex_match(path, *exclude_regex))) continue;
    // A copy of the handle: named_parameters() returns a temporary dictionary.
    const torch::Tensor weight = module->named_parameters(/*recurse=*/false)["weight"];
    // The whole weight's dimensions: a tensor-parallel rank holds a slice of one of them.
    const int tp_size = model.tensor_parallel().size();
    const ShardDim split = shard_dim(path + ".weight", model.config(), tp_size);
    const int64_t rows = weight.size(0) * (split == ShardDim::kRows ? tp_size : 1);
    const int64_t columns = weight.size(1) * (split == ShardDim::kColumns ? tp_size : 1);
    const int64_t width = std::min(rows, columns);
    HF_CHECK(config.rank <= width, key_prefix, "lora_rank ", config.rank, " is larger than ", path,
             "'s smaller dimension ", width);
    targets.push_back(path);
  }
  HF_CHECK(!target_regex || any_targeted, key_prefix,
           "target_modules = '", config.target_regex, "' matches the whole path of no projection (paths read ",
           "model.layers.0.self_attn.q_proj; a regular expression must match all of one, as PEFT's does; for ",
           "module names write a list: [q_proj, v_proj])");
  HF_CHECK(!targets.empty(), key_prefix, "exclude_modules removes every target of target_modules");
  return targets;
}

NamedTensors lora_adapter_tensors(const CausalLM& model) {
  NamedTensors tensors;
  const auto& tp = model->tensor_parallel();
  std::map<std::string, torch::Tensor> shards;
  for (const auto& item : model->named_parameters()) {
    if (!is_lora_parameter_name(item.key())) continue;
    if (tp.enabled())
      shards.emplace(item.key(), item.value());
    else
      tensors.emplace_back(kPeftPrefix + item.key(), item.value().detach());
  }
  if (!tp.enabled()) return tensors;
  // Every rank passes the same names in the same (the map's) order; model order is restored after.
  auto full = gather_full_tensors(shards, model->config(), tp);
  for (const auto& item : model->named_parameters())
    if (is_lora_parameter_name(item.key())) tensors.emplace_back(kPeftPrefix + item.key(), full.at(item.key()));
  return tensors;
}

void save_lora_adapter(const std::string& dir, const CausalLM& model, const std::string& base_model_name_or_path) {
  HF_CHECK(model->has_lora(), "save_lora_adapter(", dir, "): the model has no LoRA adapters");
  HF_CHECK(!model->lora_merged(), "save_lora_adapter(", dir, "): the adapters are merged; unmerge first");
  std::map<std::string, torch::Tensor> parameters;
  for (const auto& item : model->named_parameters()) parameters.emplace(item.key(), item.value().detach());
  const TensorParallelGroup& tp = model->tensor_parallel();
  if (tp.enabled()) {
    // The whole adapter tensors, gathered over the group (collective); rank 0 writes them.
    std::map<std::string, torch::Tensor> shards;
    for (const auto& [name, tensor] : parameters)
      if (is_lora_parameter_name(name)) shards.emplace(name, tensor);
    parameters = gather_full_tensors(shards, model->config(), tp);
    if (tp.rank() != 0) return;
  }
  save_lora_adapter(dir, parameters, model->lora_config(), model->head_kind(), base_model_name_or_path);
}

void save_lora_adapter(const std::string& dir, const std::map<std::string, torch::Tensor>& parameters,
                       const LoraConfig& lora, HeadKind head, const std::string& base_model_name_or_path) {
  NamedTensors tensors;
  for (const auto& [name, tensor] : parameters)
    if (is_lora_parameter_name(name)) tensors.emplace_back(kPeftPrefix + name, tensor);
  HF_CHECK(!tensors.empty(), "save_lora_adapter(", dir, "): no LoRA adapter tensors among the parameters");
  // PEFT records target_modules as it was given, except all-linear, which it resolves to the module names.
  json targets;
  if (!lora.target_regex.empty()) {
    targets = lora.target_regex;
  } else if (lora.target_modules == std::vector<std::string>{"all-linear"}) {
    std::set<std::string> modules;
    for (const auto& [name, tensor] : tensors) {
      const auto end = name.find(".lora_A.");
      if (end == std::string::npos) continue;
      const std::string path = name.substr(0, end);
      modules.insert(path.substr(path.rfind('.') + 1));
    }
    targets = std::vector<std::string>(modules.begin(), modules.end());
  } else {
    targets = lora.target_modules;
  }
  json excludes = nullptr;
  if (!lora.exclude_regex.empty())
    excludes = lora.exclude_regex;
  else if (!lora.exclude_modules.empty())
    excludes = lora.exclude_modules;
  json config = {{"peft_type", "LORA"},
                 {"task_type", head == HeadKind::kLanguageModel ? json("CAUSAL_LM") : json(nullptr)},
                 {"base_model_name_or_path", base_model_name_or_path},
                 {"r", lora.rank},
                 {"lora_alpha", lora.alpha},
                 {"lora_dropout", 0.0},
                 {"target_modules", targets},
                 {"exclude_modules", excludes},
                 {"bias", "none"},
                 {"fan_in_fan_out", false},
                 {"inference_mode", true},
                 {"init_lora_weights", true},
                 {"use_dora", false},
                 {"use_rslora", false},
                 {"modules_to_save", nullptr},
                 {"layers_to_transform", nullptr},
                 {"layers_pattern", nullptr},
                 {"rank_pattern", json::object()},
                 {"alpha_pattern", json::object()},
                 {"revision", nullptr}};
  make_dirs(dir);
  write_safetensors(dir + "/" + kAdapterWeightsFile, tensors, {{"format", "pt"}});
  write_file_atomic(dir + "/" + kAdapterConfigFile, config.dump(2) + "\n");
}

LoraConfig read_lora_adapter_config(const std::string& dir) {
  const std::string file = dir + "/" + kAdapterConfigFile;
  json j;
  try {
    j = json::parse(read_file(file));
  } catch (const json::exception& e) {
    throw Error(file + ": not valid JSON (" + e.what() + ")");
  }
  HF_CHECK(j.is_object(), file, ": expected a JSON object");
  auto value_or = [&](const char* key, const json& fallback) { return j.contains(key) ? j[key] : fallback; };
  HF_CHECK(value_or("peft_type", "LORA") == "LORA", file, ": peft_type ", j["peft_type"].dump(),
           " (hybridflow reads LORA adapters)");
  auto require_off = [&](const char* key, const json& off) {
    const json v = value_or(key, off);
    HF_CHECK(v.is_null() || v == off || (v.is_object() && v.empty()) || (v.is_array() && v.empty()), file, ": ",
             key, " ", v.dump(), " is not supported (expected ", off.dump(), ")");
  };
  require_off("use_dora", false);
  require_off("use_rslora", false);
  require_off("fan_in_fan_out", false);
  require_off("lora_bias", false);
  require_off("bias", "none");
  require_off("rank_pattern", json::object());
  require_off("alpha_pattern", json::object());
  require_off("modules_to_save", nullptr);
  require_off("layers_to_transform", nullptr);
  require_off("layer_replication", nullptr);
  require_off("target_parameters", nullptr);
  require_off("trainable_token_indices", nullptr);
  require_off("use_qalora", false);
  require_off("use_bdlora", nullptr);
  require_off("alora_invocation_tokens", nullptr);
  LoraConfig config;
  try {
    HF_CHECK(j.contains("r") && j["r"].is_number_integer() && j["r"].get<int64_t>() > 0, file,
             ": r must be a positive integer");
    config.rank = j["r"].get<int64_t>();
    HF_CHECK(j.contains("lora_alpha") && j["lora_alpha"].is_number(), file, ": lora_alpha must be a number");
    config.alpha = j["lora_alpha"].get<double>();
  } catch (const json::exception& e) {
    throw Error(file + ": " + e.what());
  }
  HF_CHECK(j.contains("target_modules"), file, ": target_modules is missing");
  lora_modules_from_json(j["target_modules"], file, "target_modules", &config.target_modules, &config.target_regex);
  lora_modules_from_json(value_or("exclude_modules", nullptr), file, "exclude_modules", &config.exclude_modules,
                         &config.exclude_regex);
  HF_CHECK(!config.target_modules.empty() || !config.target_regex.empty(), file, ": target_modules is empty");
  return config;
}

std::map<std::string, torch::Tensor> read_lora_adapter_tensors(const std::string& dir) {
  const std::string file = dir + "/" + kAdapterWeightsFile;
  std::map<std::string, torch::Tensor> out;
  for (auto& [name, tensor] : read_safetensors(file).tensors) {
    HF_CHECK(name.rfind(kPeftPrefix, 0) == 0, file, ": tensor ", name, " does not start with PEFT's ", kPeftPrefix);
    out.emplace(name.substr(sizeof(kPeftPrefix) - 1), tensor);
  }
  return out;
}

void load_lora_adapter(const std::string& dir, CausalLM& model) {
  const LoraConfig config = read_lora_adapter_config(dir);
  const std::string file = dir + "/" + kAdapterWeightsFile;
  auto stored = read_safetensors(file);
  std::map<std::string, torch::Tensor> by_name(stored.tensors.begin(), stored.tensors.end());
  HF_CHECK(!model->has_lora(), "load_lora_adapter(", dir, "): the model already has LoRA adapters");
  try {
    model->add_lora(config);
  } catch (const Error& e) {
    throw Error(dir + "/" + kAdapterConfigFile + " does not fit the model: " + e.what());
  }
  torch::NoGradGuard no_grad;
  for (auto& item : model->named_parameters()) {
    if (!is_lora_parameter_name(item.key())) continue;
    const std::string name = kPeftPrefix + item.key();
    auto found = by_name.find(name);
    HF_CHECK(found != by_name.end(), file, ": tensor ", name, " is missing (the adapter config targets it)");
    // A tensor-parallel rank copies its slice of the whole tensor.
    const auto shard = checkpoint_shard(item.key(), found->second, model->config(), model->tensor_parallel());
    HF_CHECK(shard.sizes() == item.value().sizes(), file, ": tensor ", name, " has shape ", found->second.sizes(),
             ", which does not fit the model's ", item.value().sizes(),
             model->tensor_parallel().enabled() ? " (this tensor-parallel rank's slice)" : "");
    item.value().copy_(shard);
    by_name.erase(found);
  }
  HF_CHECK(by_name.empty(), file, ": tensor ", by_name.begin()->first,
           " names no adapted projection of the model (another base model, or a module the config does not target)");
}

}  // namespace hybridflow
