// LoRA (Hu et al., arXiv 2106.09685) on the decoder's linear projections, compatible with Hugging Face PEFT:
// each targeted projection computes W x + b + (lora_alpha / lora_rank) * B(A x), A initialised as PEFT does
// (kaiming-uniform, a = sqrt(5)) and B zeros, so a fresh adapter leaves the model's outputs unchanged. Adding
// adapters freezes every base parameter (requires_grad false: no gradient, and an optimizer built over the
// trainable parameters keeps no state for them).
//
// Files are PEFT's: DIR/adapter_config.json and DIR/adapter_model.safetensors with tensors named
// "base_model.model.<module>.lora_A.weight" / ".lora_B.weight", e.g.
// base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight.
//
// Under tensor parallelism each rank holds its slices of the adapters (model/lora_branch.h); the files always
// hold the whole tensors.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "hybridflow/model/lora_config.h"
#include "hybridflow/model/safetensors.h"
#include "hybridflow/model/transformer.h"

namespace hybridflow {

// The module paths of `model` the config targets ("model.layers.3.mlp.down_proj"), in model order. Throws
// naming `key_prefix` + "target_modules" for a name that matches no projection, a regular expression that
// matches no projection's whole path or matches a module hybridflow does not adapt (embedding, head, norm,
// expert), or one that does not compile; and + "lora_rank" for a rank larger than a targeted layer's smaller
// dimension.
std::vector<std::string> lora_target_paths(const CausalLMImpl& model, const LoraConfig& config,
                                           const std::string& key_prefix = "lora.");

// Whether a parameter name is an adapter's ("....q_proj.lora_A.weight"). save_pretrained leaves these out and
// writes the base weights as they are: the base model, or after merge_lora() the merged model (a plain Hugging
// Face directory).
bool is_lora_parameter_name(const std::string& name);

// The adapter tensors under PEFT's names (with the "base_model.model." prefix), in model order, as views of
// the live parameters; under tensor parallelism the whole tensors gathered over the group (collective).
NamedTensors lora_adapter_tensors(const CausalLM& model);

// Writes adapter_config.json and adapter_model.safetensors (atomically) into `dir`. Under tensor parallelism
// every rank of the group calls it and rank 0 writes the whole adapter.
// `base_model_name_or_path` goes into the config as PEFT records it.
void save_lora_adapter(const std::string& dir, const CausalLM& model, const std::string& base_model_name_or_path);
// The same from a model's parameters by name (whole tensors, e.g. gathered from pipeline stages): the adapter
// tensors among them, with `lora` and `head` written into the config.
void save_lora_adapter(const std::string& dir, const std::map<std::string, torch::Tensor>& parameters,
                       const LoraConfig& lora, HeadKind head, const std::string& base_model_name_or_path);

// Reads DIR/adapter_model.safetensors: the adapter tensors by the model's parameter names (PEFT's
// "base_model.model." prefix taken off).
std::map<std::string, torch::Tensor> read_lora_adapter_tensors(const std::string& dir);

// Reads DIR/adapter_config.json: r, lora_alpha, target_modules, exclude_modules (lists of names, all-linear
// or regular expressions; save_lora_adapter writes them back as given, all-linear resolved to names as PEFT
// does). Options hybridflow does not
// implement (use_dora, use_rslora, bias other than "none", rank_pattern / alpha_pattern, modules_to_save,
// layers_to_transform, fan_in_fan_out, peft_type other than LORA) are errors naming the file and key.
LoraConfig read_lora_adapter_config(const std::string& dir);

// Adds the adapter in `dir` to `model` (which must have none yet) with its tensors: every tensor of the file
// must name a targeted projection with the projection's shapes, and every targeted projection must have
// both tensors, else an error naming the file and tensor. A tensor-parallel rank loads its slices.
void load_lora_adapter(const std::string& dir, CausalLM& model);

// `hybridflow lora merge`: loads the model in `base_dir` (config.json, weights, tokenizer.json) in fp32, adds
// the adapter in `adapter_dir`, merges W + (lora_alpha / r) B A into each adapted weight and writes `out_dir`
// as a plain Hugging Face model directory: model.safetensors under Hugging Face's names in the base's
// torch_dtype, and the base's config.json, generation config and tokenizer files copied byte for byte. Every
// error of load_pretrained and load_lora_adapter (an adapter for another base, an unsupported PEFT option)
// names its file.
void write_merged_lora_model(const std::string& base_dir, const std::string& adapter_dir, const std::string& out_dir);

}  // namespace hybridflow
