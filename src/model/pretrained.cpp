// Model directories in the Hugging Face layout: config.json, model.safetensors (or shards listed in
// model.safetensors.index.json), tokenizer.json, generation_config.json.
#include "hybridflow/model/pretrained.h"

#include <nlohmann/json.hpp>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <set>

#include "hybridflow/core/error.h"
#include "hybridflow/core/fs.h"
#include "hybridflow/core/logging.h"
#include "hybridflow/model/lora.h"
#include "hybridflow/model/model_size.h"
#include "hybridflow/model/pipeline_layout.h"
#include "hybridflow/model/safetensors.h"
#include "hybridflow/model/tensor_parallel_layout.h"
#include "hybridflow/text/generation_config.h"

namespace hybridflow {
namespace {

using json = nlohmann::json;

constexpr char kWeightsFile[] = "model.safetensors";
constexpr char kIndexFile[] = "model.safetensors.index.json";


// All tensors of a sharded checkpoint; each shard must hold exactly what the index assigns to it.
std::map<std::string, torch::Tensor> read_sharded(const std::string& dir) {
  const std::string index_path = dir + "/" + kIndexFile;
  json index;
  try {
    index = json::parse(read_file(index_path));
  } catch (const json::exception& e) {
    HF_FAIL(index_path, ": not valid JSON: ", e.what());
  }
  HF_CHECK(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(), index_path,
           ": missing object 'weight_map' {tensor name: shard file}");
  std::map<std::string, std::set<std::string>> names_by_shard;
  for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
    HF_CHECK(it.value().is_string(), index_path, ": weight_map entry '", it.key(), "' must be a file name");
    const std::string shard = it.value().get<std::string>();
    HF_CHECK(!shard.empty() && shard.find('/') == std::string::npos && shard != "..", index_path,
             ": weight_map entry '", it.key(), "' names '", shard, "', which is not a file in the directory");
    names_by_shard[shard].insert(it.key());
  }
  std::map<std::string, torch::Tensor> tensors;
  for (const auto& [shard, names] : names_by_shard) {
    const std::string shard_path = dir + "/" + shard;
    HF_CHECK(file_exists(shard_path), index_path, ": shard '", shard, "' listed in weight_map does not exist");
    std::set<std::string> found;
    for (auto& [name, tensor] : map_safetensors(shard_path).tensors) {
      HF_CHECK(names.count(name), shard_path, ": holds tensor '", name, "' that ", kIndexFile,
               " does not assign to this shard");
      found.insert(name);
      tensors[name] = std::move(tensor);
    }
    for (const auto& name : names)
      HF_CHECK(found.count(name), shard_path, ": tensor '", name, "' listed in ", kIndexFile, " is not in the shard");
  }
  return tensors;
}

std::map<std::string, torch::Tensor> read_weights(const std::string& dir) {
  if (file_exists(dir + "/" + kWeightsFile)) {
    auto file = map_safetensors(dir + "/" + kWeightsFile);
    return {std::make_move_iterator(file.tensors.begin()), std::make_move_iterator(file.tensors.end())};
  }
  HF_CHECK(file_exists(dir + "/" + kIndexFile), dir, ": no weights: expected ", kWeightsFile, " or ", kIndexFile);
  return read_sharded(dir);
}

// Rotary inverse frequencies are recomputed from the config; old transformers versions saved them.
bool is_rotary_buffer(const std::string& name) {
  const std::string suffix = "rotary_emb.inv_freq";
  return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

std::string shape_text(const std::vector<int64_t>& shape) { return c10::str(c10::IntArrayRef(shape)); }

std::string count_text(double count) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, count < 1e18 ? "%.0f" : "%.3g", count);
  return buffer;
}

// What config.json implies against what the files hold (their headers: mapped, not read), before any
// module is built, so a config that does not match its weights fails naming them and allocates nothing.
// Lists stay short: a config with a million layers names millions of missing weights. "" when they match.
std::string weight_mismatches(const std::map<std::string, torch::Tensor>& weights, const ModelConfig& config,
                              HeadKind head, const PipelineStage& stage) {
  constexpr size_t kListed = 20;
  const bool value_head = head == HeadKind::kValue;
  std::vector<std::string> missing, wrong_shape;
  size_t missing_count = 0, wrong_count = 0;
  bool stopped = false;
  std::set<std::string> matched;
  for_each_expected_weight(config, value_head, [&](const std::string& name, const std::vector<int64_t>& shape) {
    if (stage.enabled() && !stage_holds(name, config, head, stage)) return true;
    auto it = weights.find(name);
    if (it == weights.end()) {
      if (value_head && name == "score.weight") return true;  // a fresh value head: the caller initialises it
      if (++missing_count <= kListed) missing.push_back(name);
      stopped = missing_count >= 1000;
      return !stopped;
    }
    matched.insert(name);
    if (it->second.sizes().vec() != shape && ++wrong_count <= kListed)
      wrong_shape.push_back(name + " (file " + c10::str(it->second.sizes()) + ", model " + shape_text(shape) + ")");
    return true;
  });
  std::vector<std::string> unexpected;
  if (!stopped)
    for (const auto& [name, tensor] : weights)
      if (!matched.count(name) && unexpected.size() < kListed) unexpected.push_back(name);
  if (missing.empty() && wrong_shape.empty() && unexpected.empty()) return "";
  auto more = [](size_t count) { return count > kListed ? ", ... " + std::to_string(count - kListed) + " more" : ""; };
  std::string out;
  if (!missing.empty())
    out += " missing [" + join(missing) +
           (stopped ? ", ... config.json implies " + count_text(expected_weight_count(config, value_head)) +
                          " weights (num_hidden_layers " + std::to_string(config.num_hidden_layers) + "), the files hold " +
                          std::to_string(weights.size())
                    : more(missing_count)) +
           "]";
  if (!wrong_shape.empty()) out += " wrong shape [" + join(wrong_shape) + more(wrong_count) + "]";
  if (!unexpected.empty()) out += " unexpected [" + join(unexpected) + "]";
  return out;
}

// The files' tensors less those a load ignores: saved rotary buffers, a tied or value model's lm_head.
void drop_ignored_weights(std::map<std::string, torch::Tensor>& weights, const ModelConfig& config, HeadKind head) {
  for (auto it = weights.begin(); it != weights.end();) it = is_rotary_buffer(it->first) ? weights.erase(it) : ++it;
  if (config.tie_word_embeddings || head == HeadKind::kValue) weights.erase("lm_head.weight");
}

}  // namespace

torch::Dtype parse_dtype(const std::string& name, const std::string& key) {
  if (name == "float32" || name == "fp32") return torch::kFloat32;
  if (name == "bfloat16" || name == "bf16") return torch::kBFloat16;
  if (name == "float16" || name == "fp16") return torch::kFloat16;
  HF_FAIL(key, ": expected fp32 | bf16 | fp16 (or float32 | bfloat16 | float16), got '", name, "'");
}

Pretrained load_pretrained(const std::string& dir, HeadKind head, torch::Dtype dtype, TensorParallelGroup tp,
                           PipelineStage stage) {
  Pretrained out;
  out.config = load_model_config(dir + "/config.json");
  out.tokenizer = Tokenizer::load(dir + "/tokenizer.json");
  HF_CHECK(out.tokenizer.vocab_size() <= out.config.vocab_size, dir, ": tokenizer.json has ",
           out.tokenizer.vocab_size(), " tokens but config.json vocab_size is ", out.config.vocab_size);

  // The files' headers first (mapped, nothing read yet), the model after: a mismatch allocates nothing.
  std::map<std::string, torch::Tensor> weights = read_weights(dir);
  // Checkpoints of tied models may still carry lm_head.weight (a copy of the embedding); a value
  // model initialised from a language model drops the LM head and starts a fresh value head.
  const bool value_head = head == HeadKind::kValue;
  drop_ignored_weights(weights, out.config, head);
  // A pipeline stage reads only its own layers; the names of the others' are checked, so that a stray
  // tensor is still reported.
  if (stage.enabled())
    for (auto it = weights.begin(); it != weights.end();) {
      bool other_stage = false;
      try {
        other_stage = !stage_holds(it->first, out.config, head, stage);
      } catch (const Error&) {
        // not a weight of this model at all: left for the unexpected-tensor report below
      }
      it = other_stage ? weights.erase(it) : ++it;
    }

  const std::string mismatches = weight_mismatches(weights, out.config, head, stage);
  HF_CHECK(mismatches.empty(), dir, ": weights do not match config.json:", mismatches);
  out.model = CausalLM(out.config, head, tp, stage);

  // Under tensor parallelism each rank copies its slice out of the mapped file: only those pages are read.
  // (The whole shapes were checked above; this compares each rank's slice.)
  std::vector<std::string> missing, wrong_shape;
  auto params = out.model->named_parameters(/*recurse=*/true);
  for (const auto& item : params) {
    auto it = weights.find(item.key());
    if (it == weights.end()) {
      if (value_head && item.key() == "score.weight") {
        log_info(dir, ": no score.weight, value head initialised fresh");
        out.fresh_value_head = true;
        continue;
      }
      missing.push_back(item.key());
    } else if (checkpoint_shard(item.key(), it->second, out.config, tp).sizes() != item.value().sizes()) {
      wrong_shape.push_back(item.key() + " (file " + c10::str(it->second.sizes()) + ", model " +
                            c10::str(item.value().sizes()) + (tp.enabled() ? " on this tensor-parallel rank" : "") +
                            ")");
    }
  }
  std::vector<std::string> unexpected;
  for (const auto& [name, tensor] : weights)
    if (!params.contains(name)) unexpected.push_back(name);
  HF_CHECK(missing.empty() && wrong_shape.empty() && unexpected.empty(), dir, ": weights do not match config.json:",
           missing.empty() ? "" : " missing [" + join(missing) + "]",
           wrong_shape.empty() ? "" : " wrong shape [" + join(wrong_shape) + "]",
           unexpected.empty() ? "" : " unexpected [" + join(unexpected) + "]");

  out.model->to(dtype);
  torch::NoGradGuard no_grad;
  for (auto& item : params) {
    auto it = weights.find(item.key());
    if (it != weights.end()) item.value().copy_(checkpoint_shard(item.key(), it->second, out.config, tp).to(dtype));
  }
  return out;
}

std::vector<std::string> check_model_directory(const std::string& dir) {
  ModelConfig config;
  try {
    config = load_model_config(dir + "/config.json");
  } catch (const Error& e) {
    return {e.what()};
  }
  std::vector<std::string> problems;
  std::map<std::string, torch::Tensor> weights;
  try {
    weights = read_weights(dir);  // every header is checked against its file's size: truncation shows here
  } catch (const Error& e) {
    problems.push_back(e.what());
  }
  if (problems.empty()) {
    // A value model (critic, reward model) carries score.weight instead of lm_head.weight.
    const HeadKind head = weights.count("score.weight") ? HeadKind::kValue : HeadKind::kLanguageModel;
    drop_ignored_weights(weights, config, head);
    const std::string mismatches = weight_mismatches(weights, config, head, PipelineStage{});
    if (!mismatches.empty()) problems.push_back(dir + ": weights do not match config.json:" + mismatches);
  }
  if (file_exists(dir + "/tokenizer.json")) {
    try {
      const Tokenizer tokenizer = Tokenizer::load(dir + "/tokenizer.json");
      if (tokenizer.vocab_size() > config.vocab_size)
        problems.push_back(dir + ": tokenizer.json has " + std::to_string(tokenizer.vocab_size()) +
                           " tokens but config.json vocab_size is " + std::to_string(config.vocab_size));
    } catch (const Error& e) {
      problems.push_back(e.what());
    }
  }
  return problems;
}

void save_pretrained(const std::string& dir, const CausalLM& model, const Tokenizer& tokenizer) {
  HF_CHECK(!model->pipeline_stage().enabled(), "save_pretrained: the model is pipeline stage ",
           model->pipeline_stage().stage, " of ", model->pipeline_stage().stages,
           "; collect every stage's weights and save those");
  std::map<std::string, torch::Tensor> weights;
  const auto& tp = model->tensor_parallel();
  if (tp.enabled()) {
    weights = gather_full_state(*model);
    if (tp.rank() != 0) return;
  } else {
    // LoRA adapters are not part of a Hugging Face model directory (save_lora_adapter writes them).
    for (const auto& item : model->named_parameters(/*recurse=*/true))
      if (!is_lora_parameter_name(item.key())) weights.emplace(item.key(), item.value().detach());
  }
  save_pretrained(dir, model->config(), weights, tokenizer);
}

void save_pretrained(const std::string& dir, const ModelConfig& config,
                     const std::map<std::string, torch::Tensor>& weights, const Tokenizer& tokenizer) {
  const torch::Dtype dtype = parse_dtype(config.torch_dtype, "torch_dtype");
  NamedTensors tensors;
  for (const auto& [name, tensor] : weights) tensors.emplace_back(name, tensor.to(torch::kCPU, dtype));
  make_dirs(dir);
  save_model_config(config, dir + "/config.json");
  // transformers refuses safetensors files without format=pt metadata.
  write_safetensors(dir + "/" + kWeightsFile, tensors, {{"format", "pt"}});
  tokenizer.save(dir + "/tokenizer.json");
  // The source model's generation_config.json (its eos list and recommended sampling) outlives training:
  // tokenizer.save wrote it back. Without one, the config's special ids.
  if (!tokenizer.source_generation_config().empty()) return;
  json generation = {{"_from_model_config", true}};
  if (config.bos_token_id >= 0) generation["bos_token_id"] = config.bos_token_id;
  if (config.eos_token_id >= 0) generation["eos_token_id"] = config.eos_token_id;
  if (config.pad_token_id >= 0) generation["pad_token_id"] = config.pad_token_id;
  write_file_atomic(dir + "/generation_config.json", generation.dump(2) + "\n");
}

std::vector<int64_t> generation_stop_ids(std::vector<int64_t> ids, int64_t tokenizer_eos) {
  if (tokenizer_eos >= 0 && std::find(ids.begin(), ids.end(), tokenizer_eos) == ids.end()) ids.push_back(tokenizer_eos);
  return ids;
}

std::vector<int64_t> generation_stop_ids(const std::string& dir, int64_t tokenizer_eos) {
  const std::string file = dir + "/generation_config.json";
  if (dir.empty() || !std::filesystem::exists(file)) return generation_stop_ids(std::vector<int64_t>{}, tokenizer_eos);
  return generation_stop_ids(text::GenerationDefaults::load(file).eos_token_ids, tokenizer_eos);
}

}  // namespace hybridflow
