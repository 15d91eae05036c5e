// A Hugging Face style model directory: config.json + model.safetensors (or sharded with
// model.safetensors.index.json) + tokenizer.json.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "hybridflow/model/model_config.h"
#include "hybridflow/model/tokenizer.h"
#include "hybridflow/model/transformer.h"

namespace hybridflow {

struct Pretrained {
  ModelConfig config;
  CausalLM model{nullptr};
  Tokenizer tokenizer;
  // A value-head model loaded from a language-model directory: score.weight was not in the files and holds
  // whatever the constructor drew (which depends on the tensor-parallel split); the caller initialises it.
  bool fresh_value_head = false;
};

// Loads config, weights (F32/F16/BF16 on disk, cast to `dtype` in memory) and tokenizer.
// Every failure names the file and what was wrong. With a tensor-parallel group the model holds this
// rank's shards, copied from the memory-mapped files: each rank reads only its slices. With a pipeline
// stage it holds that stage's weights only (the others' are skipped, not reported as unexpected).
Pretrained load_pretrained(const std::string& dir, HeadKind head = HeadKind::kLanguageModel,
                           torch::Dtype dtype = torch::kFloat32, TensorParallelGroup tp = {},
                           PipelineStage stage = {});
// Writes the directory atomically (each file to a temp name, then rename), weights in config.torch_dtype.
// A tensor-parallel model is gathered over its group (collective) and written whole by its rank 0, so a
// checkpoint loads into any layout.
// The ids a generation from this directory stops at: generation_config.json's eos_token_id (one id or a list)
// when `dir` has that file, then `tokenizer_eos` (>= 0) when not among them. `dir` may be empty.
std::vector<int64_t> generation_stop_ids(const std::string& dir, int64_t tokenizer_eos);
// The same from a generation_config.json's eos ids already read.
std::vector<int64_t> generation_stop_ids(std::vector<int64_t> generation_config_eos, int64_t tokenizer_eos);

// Everything wrong with a model directory, without building the model or reading the weights' data: a
// config.json that does not load, weight files that are truncated or malformed (their headers are checked
// against the files' sizes), weights whose names or shapes do not match config.json, a tokenizer larger than
// vocab_size. Empty when the directory loads. Used by `hybridflow info`.
std::vector<std::string> check_model_directory(const std::string& dir);

void save_pretrained(const std::string& dir, const CausalLM& model, const Tokenizer& tokenizer);
// The same directory from whole tensors the caller collected (e.g. from every pipeline stage), written in
// config.torch_dtype.
void save_pretrained(const std::string& dir, const ModelConfig& config,
                     const std::map<std::string, torch::Tensor>& weights, const Tokenizer& tokenizer);

// "fp32"/"float32", "bf16"/"bfloat16", "fp16"/"float16" -> dtype; anything else is an error naming `key`.
torch::Dtype parse_dtype(const std::string& name, const std::string& key);

// config.json <-> ModelConfig (throws naming the file and key).
ModelConfig load_model_config(const std::string& config_json_path);
void save_model_config(const ModelConfig& config, const std::string& config_json_path);

}  // namespace hybridflow
