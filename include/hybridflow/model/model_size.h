// What a model config costs before a single tensor exists: its parameter count (in floating point, since an
// absurd config.json overflows int64), the shape of every weight it implies, and whether this process can
// hold it. A hostile or mistyped config (num_hidden_layers: 1000000) must fail with a message naming the key,
// not take the machine's memory while the modules are built.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "hybridflow/model/model_config.h"

namespace hybridflow {

struct ModelSize {
  // Each term in parameters; their sum is num_parameters() (value head: no lm_head, plus score.weight).
  double embeddings = 0;  // embed_tokens (and an untied lm_head)
  double attention = 0;   // every layer's q/k/v/o projections, biases and q/k norms
  double mlp = 0;         // every layer's gate/up/down projections
  double other = 0;       // norms and the value head
  double parameters() const { return embeddings + attention + mlp + other; }
};
ModelSize model_size(const ModelConfig& config, bool value_head = false);

// Bytes this process may still allocate, and where that number comes from: MemAvailable + SwapFree of
// /proc/meminfo, lowered by a cgroup's memory.max and by RLIMIT_AS (ulimit -v) when they are tighter.
struct AvailableMemory {
  double bytes = 0;
  std::string source;  // "MemAvailable + SwapFree in /proc/meminfo", "RLIMIT_AS (ulimit -v) headroom", ...
};
AvailableMemory available_memory();

// Throws hybridflow::Error, naming the config keys that make the model large, when `share` of its parameters
// at `bytes_per_parameter` each exceeds available_memory(). `where` starts the message ("model config").
void check_model_fits_memory(const ModelConfig& config, bool value_head, double bytes_per_parameter, double share,
                             const std::string& where);

// The Hugging Face name and shape of every weight a whole (not sharded, every stage) CausalLM of this config
// holds: what its safetensors files must contain. `visit` returns false to stop early (a config with a
// million layers names millions of weights); the count is known up front from expected_weight_count.
using WeightVisitor = std::function<bool(const std::string& name, const std::vector<int64_t>& shape)>;
void for_each_expected_weight(const ModelConfig& config, bool value_head, const WeightVisitor& visit);
double expected_weight_count(const ModelConfig& config, bool value_head = false);
// All of them in a map, for configs known to be small (tests, `hybridflow info` after the count is checked).
std::map<std::string, std::vector<int64_t>> expected_weight_shapes(const ModelConfig& config, bool value_head = false);

// "1.5 GiB", "12 PiB": a byte count for messages.
std::string human_bytes(double bytes);

}  // namespace hybridflow
