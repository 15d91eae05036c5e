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
  double mlp = 0;         // dense layers' gate/up/down projections; MoE layers' routers and shared experts
  double experts = 0;     // every routed expert of every MoE layer
  double active_experts = 0;  // the num_experts_per_tok experts a token goes through, every MoE layer
  double other = 0;       // norms and the value head
  double parameters() const { return embeddings + attention + mlp + experts + other; }
  // The parameters one token's forward uses: a mixture of experts' "active" count (A3B of Qwen3-30B-A3B).
  double active_parameters() const { return embeddings + attention + mlp + active_experts + other; }
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

// The bytes one rank holds to train a model: what `hybridflow info` prints and what the placement planner
// (placement/role_costs.h) budgets. Parameters are split over tp x pp ranks; the optimizer state over `zero`.
struct TrainingMemoryOptions {
  double weight_bytes = 2;  // 2: bf16 / fp16 weights against fp32 masters; 4: fp32 weights, no masters
  int64_t tp = 1, pp = 1;
  int64_t zero = 1;  // data-parallel ranks the optimizer state is partitioned over (ZeRO-1); 1 = none
  int64_t micro_rows = 1, sequence = 1;  // a micro-batch of micro_rows sequences of `sequence` tokens
  bool value_head = false;               // a critic: a 1-output score instead of the vocabulary's logits
  // How gradients and masters are held. TrainEngine (engine/train_engine.h) adds each micro-batch's
  // low-precision gradients into fp32 gradients of the masters, and keeps the whole fp32 masters on every
  // ZeRO rank (only Adam's moments are partitioned). Megatron's distributed optimizer, which the planner
  // models, holds gradients in the weights' dtype and partitions the masters with the moments.
  bool fp32_gradients = true;
  bool masters_partitioned = false;
};
struct TrainingMemory {
  double weights = 0;    // the module's parameters, in their dtype
  double grads = 0;      // their gradients (and, with fp32_gradients under bf16, the masters' fp32 ones)
  double masters = 0;    // fp32 master weights (bf16 / fp16 training only)
  double adam = 0;       // Adam's two fp32 moments
  double optimizer = 0;  // masters + adam, summed as the planner has always summed them
  // Activations a micro-batch keeps for its backward pass, by Megatron's estimate of 17 x hidden values of
  // the weights' dtype per token per layer (FlashAttention: no [seq x seq] scores; sequence parallelism
  // splits them over tp). 1F1B keeps the first stage's p micro-batches of L/p layers: L layers' worth.
  double activations = 0;
  // The same with activation checkpointing: each layer's input is kept and one layer's set is recomputed.
  double checkpointed_activations = 0;
  // The vocabulary's logits and their gradient in fp32 over the micro-batch's tokens, split over tp (a
  // critic has none). Chunked log-probs hold a fraction of this at a time.
  double logits = 0;
  double state() const { return weights + grads + optimizer; }  // held from step to step
  double peak(bool checkpointing) const {
    return state() + (checkpointing ? checkpointed_activations : activations) + logits;
  }
};
TrainingMemory training_memory(const ModelConfig& config, const TrainingMemoryOptions& options);

// "1.5 GiB", "12 PiB": a byte count for messages.
std::string human_bytes(double bytes);

}  // namespace hybridflow
